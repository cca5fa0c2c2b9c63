"""Every benchmark `make bench` runs, with what each needs to run at all.

Why a table and not a glob: a benchmark script may need arguments (the
operator's has two modes) or something this machine may lack (a cluster, the
`transformers` CLI). Each entry says so, and the runner skips it with the
reason printed instead of failing on it or silently leaving it out. A test
checks that every `bench/*_bench.py` has an entry, so a new script cannot be
forgotten. GPU checks (`gpu_check.py`) are not benchmarks here: `make
gpu-check` runs them on a machine with a GPU. The GPU benchmark
(`gpu_bench.py`) is listed, and skipped where there is no NVIDIA GPU.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# A cluster to use: the e2e tests' variable, else the one `python -m localcluster env` exports.
KUBECONFIG_ENVS = ("FUSEBOX_KUBECONFIG", "KUBECONFIG")


@dataclass(frozen=True)
class Benchmark:
    name: str
    script: str  # a file in bench/
    arguments: Callable[[Mapping[str, str]], tuple[str, ...]] = lambda environ: ()
    # Returns why the benchmark cannot run here, or None when it can.
    missing: Callable[[Mapping[str, str]], str | None] = lambda environ: None

    def command(self, environ: Mapping[str, str]) -> list[str]:
        return [sys.executable, str(HERE / self.script), *self.arguments(environ)]


def _transformers_cli(environ: Mapping[str, str]) -> str | None:
    cli = Path(sys.executable).with_name("transformers")
    if not cli.exists():
        return f"no `transformers` CLI next to {sys.executable} (the peer it compares with)"
    return None


def _gpu(environ: Mapping[str, str]) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (no nvidia-smi); bench/gpu_run.sh runs gpu_bench.py on the H200"
    return None


def _module(name: str) -> Callable[[Mapping[str, str]], str | None]:
    def missing(environ: Mapping[str, str]) -> str | None:
        if importlib.util.find_spec(name) is None:
            return f"Python package {name} is not installed (run `make setup-python`)"
        return None

    return missing


def _kubeconfig(environ: Mapping[str, str]) -> tuple[str, str] | None:
    for name in KUBECONFIG_ENVS:
        if environ.get(name):
            return name, environ[name]
    return None


def _cluster(environ: Mapping[str, str]) -> str | None:
    found = _kubeconfig(environ)
    if found is None:
        return (
            f"no cluster: set {' or '.join(KUBECONFIG_ENVS)} to a kubeconfig "
            "(`make cluster-up`, then `python -m localcluster env` prints it)"
        )
    name, kubeconfig = found
    if not Path(kubeconfig).is_file():
        return f"{name}={kubeconfig} is not a file"
    kubectl = environ.get("KUBECTL", "kubectl")
    if shutil.which(kubectl) is None:
        return f"{kubectl} is not on PATH (set KUBECTL to its path)"
    return None


def _fleet_tools(environ: Mapping[str, str]) -> str | None:
    """The fleet simulation runs its own loopback control plane: the cluster binaries
    must be built, and Go must be there to build kwok on first use."""
    binaries = HERE.parent / ".cache" / "bin"
    wanted = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
    missing = [name for name in wanted if not (binaries / name).exists()]
    if missing:
        return f"no {', '.join(missing)} in .cache/bin (run `make setup-binaries`)"
    if shutil.which("go") is None:
        return "no Go toolchain to build kwok (localcluster/build-kwok.sh)"
    return None


def _grammar_libraries(environ: Mapping[str, str]) -> str | None:
    """The grammar libraries are compared before any goes in the lock, so they are
    installed outside it (bench/grammar_engines_bench.py says how) and found on PYTHONPATH."""
    modules = ("xgrammar", "llguidance", "outlines_core")
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not importable: not in the project lock; install them "
            "outside it and put them on PYTHONPATH (bench/grammar_engines_bench.py)"
        )
    return None


SUITE: tuple[Benchmark, ...] = (
    Benchmark("server", "server_bench.py", missing=_transformers_cli),
    # The same comparison on a real shape: the llama3 zoo model under bench/workload.py.
    Benchmark("server-realistic", "realistic_bench.py", missing=_transformers_cli),
    Benchmark("kernels", "kernels_bench.py"),
    Benchmark("slot-cache", "slot_cache_bench.py"),
    # Where the server's CPU per streamed token goes: the model, the worker's host work, the loop.
    Benchmark("host-profile", "host_profile.py"),
    Benchmark("sampling", "sampling_bench.py"),
    Benchmark("structured-output", "structured_output_bench.py"),
    Benchmark("grammar-engines", "grammar_engines_bench.py", missing=_grammar_libraries),
    Benchmark("sidecar", "sidecar_bench.py"),
    Benchmark("gpu", "gpu_bench.py", missing=_gpu),
    Benchmark(
        "operator-reaction",
        "operator_bench.py",
        lambda environ: ("reaction",),
        missing=_module("aiohttp"),
    ),
    Benchmark(
        "operator-scale",
        "operator_bench.py",
        lambda environ: ("scale", "--kubeconfig", (_kubeconfig(environ) or ("", ""))[1]),
        missing=_cluster,
    ),
    # kwok nodes and one simulator process for every pod; --quick here: the full
    # 2,000 x 2 size is `python bench/operator_scale_bench.py` on a bigger machine.
    Benchmark(
        "operator-fleet",
        "operator_scale_bench.py",
        lambda environ: ("--quick",),
        missing=_fleet_tools,
    ),
)


def scripts_without_an_entry() -> list[str]:
    """`bench/*_bench.py` files the suite does not run: must be empty."""
    listed = {benchmark.script for benchmark in SUITE}
    return sorted(path.name for path in HERE.glob("*_bench.py") if path.name not in listed)


def environment() -> Mapping[str, str]:
    return os.environ
