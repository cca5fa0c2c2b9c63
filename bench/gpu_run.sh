#!/usr/bin/env bash
# The GPU benchmark (bench/gpu_bench.py) on the lent H200, in two steps.
#
# 1. Here, once per checkout:   bash bench/gpu_run.sh wheels
#    downloads into .whl/ (ignored by git) the packages the H200's image lacks
#    or holds in another version, at the versions this venv runs, so Fusebox
#    and `transformers serve` there run the same code as the CPU figures.
# 2. The device tool's `run`, with exactly:
#      command:   bash bench/gpu_run.sh device
#      carry:     [".whl"]
#      timeout_s: 590
#    It installs the wheels into /tmp/site, checks every import first (a few
#    seconds, not a whole run, if a wheel is missing), then runs the bench with
#    its 480 s budget and writes under $OUT: gpu.json, gpu.png, servers.log (the
#    servers' log tails), run.log and nvidia-smi.txt (5 files; 8 come back).
#    Copy gpu.json and gpu.png from the reply's files_at into bench/results/gpu/.
#    Arguments after `device` go to gpu_bench.py (e.g. --budget-seconds 300).
set -euo pipefail
cd "$(dirname "$0")/.."

# Missing on the H200's image (KINDS.md), or older there than these need.
WHEELS=(
  transformers fastapi starlette uvicorn pydantic pydantic_core openai httpx2 httpcore2
  truststore jiter sniffio structlog annotated-types typing-inspection opentelemetry-api
  anyio typing_extensions typer
)

case "${1:-}" in
wheels)
  echo /.whl/ | { grep -qxF /.whl/ .git/info/exclude 2>/dev/null || { mkdir -p .git/info; cat >>.git/info/exclude; }; }
  mkdir -p .whl
  py=.venv/bin/python
  pins=$("$py" -c 'import sys; from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' "${WHEELS[@]}")
  # shellcheck disable=SC2086
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl $pins
  du -sh .whl
  ;;
device)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/inference_image:$PWD/contract:$PWD"
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
  python3 -c 'import fusebox_server.app, transformers.cli.serving.server, transformers, torch
print("imports ok: transformers", transformers.__version__, "torch", torch.__version__)'
  # The bench keeps to its 480 s budget and writes gpu.json after every phase; the
  # timeout only stops a hung server from eating the rest of the device's time.
  set -o pipefail
  timeout -k 10 530 python3 bench/gpu_bench.py --work-dir /tmp/gpu-bench --out "$OUT" "${@:2}" \
    2>&1 | tee "$OUT/run.log"
  ;;
*)
  echo "usage: $0 wheels|device" >&2
  exit 2
  ;;
esac
