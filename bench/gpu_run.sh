#!/usr/bin/env bash
# Every GPU check in one device call, in two steps.
#
# 1. Here, once per checkout:   bash bench/gpu_run.sh wheels
#    downloads into .whl/ (ignored by git) the packages the H200's image lacks
#    or holds in another version, at the versions this venv runs, so the server,
#    the sidecar and `transformers serve` there run the same code as here.
# 2. The device tool's `run`, with exactly:
#      command:   bash bench/gpu_run.sh device
#      carry:     [".whl"]
#      timeout_s: 600
#    It installs the wheels into /tmp/site, checks every import first (a few
#    seconds, not a whole run, if a wheel is missing), then runs
#      - bench/gpu_check.py (issues 10 and 13: the leak fault and what each admin
#        action frees, primary -> each fallback quantization -> primary under
#        traffic, each leak kind and the ladder step that frees it), 200 s budget;
#      - bench/gpu_profile.py (where a decode step's time goes), about 40 s;
#      - bench/gpu_zoo.py (per zoo family: graphs vs the eager slot batch vs
#        transformers' batched generate, teacher-forced logits), 120 s at most,
#        only when GPU_STEPS names it (the three above fill a 600 s call);
#      - bench/gpu_sampling.py (issue 33: penalised, biased, scored and sampled rows
#        through the captured step, each as alone, and ms per step plain vs mixed),
#        under a minute, only when GPU_STEPS names it ("sampling" alone is one short call);
#      - bench/slot_cache_bench.py's drain with graphs on (issue 34: the slot cache held,
#        shrinking vs growing only, and the decode time with the recaptures a shrink
#        costs), about a minute, only when GPU_STEPS names "slotcache";
#      - bench/host_profile.py on CUDA (issue 34: the server's CPU per streamed token at
#        64 clients on gpu_bench's 1 B model, split into the model's step, the worker's
#        host work and the event loop), about a minute, only when GPU_STEPS names
#        "hostprofile";
#      - bench/gpu_bench.py (issue 12: generation speed against the peers),
#        with what is left of the call (GPU_BENCH_SECONDS, 220 by default);
#      - bench/gpu_realistic.py (issue 34: Llama-3.1-8B's full configuration, random bf16
#        weights made on the device, under bench/workload.py's full-length traffic:
#        Fusebox at 64/32/128 clients and 3 Poisson rates, the admission probe, the
#        `transformers serve` sweep, Fusebox's engine in process, compiled static-cache
#        `generate`), only when GPU_STEPS names it, and then alone: it fills a call by
#        itself. Its budget is GPU_REALISTIC_SECONDS, by default what the call has left
#        (590 s less the time spent so far, about 540 s); it cuts rounds to fit, never
#        hangs. One call: GPU_STEPS=realistic bash bench/gpu_run.sh device
#        (docs/decisions/realistic-workload.md, "On the GPU").
#    Device results come back as $OUT/results.tar.gz (gpu-check/, gpu/, profile/, zoo/, sampling/,
#    slot-cache/, host-profile/, realistic/),
#    beside run.log and nvidia-smi.txt: the device returns at most 8 files.
#    Unpack with: tar -xzf results.tar.gz -C bench/results
#    Arguments after `device` go to gpu_bench.py (e.g. --concurrency 32).
#    GPU_STEPS picks the scripts (default "check profile bench"; "zoo" alone is
#    one short call): a session
#    short of device time can run `GPU_STEPS="profile bench" bash bench/gpu_run.sh device`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Missing on the H200's image (KINDS.md), or older there than these need.
WHEELS=(
  transformers fastapi starlette uvicorn pydantic pydantic_core openai httpx2 httpcore2
  truststore jiter sniffio structlog annotated-types typing-inspection opentelemetry-api
  anyio typing_extensions typer torchao
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
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
  du -sh .whl
  ;;
device)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD/inference_image:$PWD/contract:$PWD"
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  results=/tmp/gpu-results
  mkdir -p "$results/gpu-check" "$results/gpu" "$results/profile" "$results/zoo" "$results/sampling" \
    "$results/slot-cache" "$results/host-profile" "$results/realistic"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
  python3 -c 'import fusebox_server.http.app, fusebox_sidecar.__main__, torchao.quantization
import transformers.cli.serving.server, transformers, torch, torchao
print("imports ok: transformers", transformers.__version__, "torch", torch.__version__,
      "torchao", torchao.__version__)' 2>&1 | tee "$OUT/run.log"
  pack() {
    tar -czf "$OUT/results.tar.gz" -C "$results" \
      gpu-check gpu profile zoo sampling slot-cache host-profile realistic
  }
  trap pack EXIT
  steps=" ${GPU_STEPS:-check profile bench} "
  # Each script keeps to its budget and writes its files as it goes; the
  # timeouts only stop a hung server from eating the other's device time.
  if [[ $steps == *" check "* ]]; then
    echo "== gpu_check ==" | tee -a "$OUT/run.log"
    timeout -k 10 230 python3 bench/gpu_check.py --out "$results/gpu-check" \
      --budget-seconds 200 2>&1 | tee -a "$OUT/run.log" || echo "gpu_check: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" profile "* ]]; then
    echo "== gpu_profile ==" | tee -a "$OUT/run.log"
    timeout -k 5 120 python3 bench/gpu_profile.py --out "$results/profile" 2>&1 \
      | tee -a "$OUT/run.log" || echo "gpu_profile: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" zoo "* ]]; then
    echo "== gpu_zoo ==" | tee -a "$OUT/run.log"
    timeout -k 5 120 python3 bench/gpu_zoo.py --work-dir /tmp/gpu-zoo --out "$results/zoo" 2>&1 \
      | tee -a "$OUT/run.log" || echo "gpu_zoo: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" sampling "* ]]; then
    echo "== gpu_sampling ==" | tee -a "$OUT/run.log"
    timeout -k 5 120 python3 bench/gpu_sampling.py --out "$results/sampling" 2>&1 \
      | tee -a "$OUT/run.log" || echo "gpu_sampling: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" slotcache "* ]]; then
    echo "== slot_cache_bench ==" | tee -a "$OUT/run.log"
    timeout -k 5 150 python3 bench/slot_cache_bench.py --requests 64 --scale 1 \
      --out "$results/slot-cache/slot-cache.json" 2>&1 | tee -a "$OUT/run.log" \
      || echo "slot_cache_bench: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" hostprofile "* ]]; then
    echo "== host_profile ==" | tee -a "$OUT/run.log"
    timeout -k 5 150 python3 bench/host_profile.py --device cuda --work-dir /tmp/gpu-bench \
      --out "$results/host-profile" --clients 64 --seconds 20 2>&1 | tee -a "$OUT/run.log" \
      || echo "host_profile: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" bench "* ]]; then
    echo "== gpu_bench ==" | tee -a "$OUT/run.log"
    bench_seconds=${GPU_BENCH_SECONDS:-220}
    timeout -k 10 $((bench_seconds + 25)) python3 bench/gpu_bench.py --work-dir /tmp/gpu-bench \
      --out "$results/gpu" --budget-seconds "$bench_seconds" "${@:2}" 2>&1 | tee -a "$OUT/run.log" \
      || echo "gpu_bench: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
    pack
  fi
  if [[ $steps == *" realistic "* ]]; then
    echo "== gpu_realistic ==" | tee -a "$OUT/run.log"
    realistic_seconds=${GPU_REALISTIC_SECONDS:-$((590 - SECONDS))}
    if (( realistic_seconds < 120 )); then
      echo "gpu_realistic: skipped, ${realistic_seconds} s left (run it alone: GPU_STEPS=realistic)" \
        | tee -a "$OUT/run.log"
      exit 0
    fi
    # The 16 GB model is written once and read by every server: in memory when /dev/shm
    # has room (seconds), else on local disk.
    work=/tmp/gpu-realistic
    shm_free_kib=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 || echo 0)
    if (( ${shm_free_kib:-0} > 40000000 )); then work=/dev/shm/gpu-realistic; fi
    timeout -k 10 $((realistic_seconds + 20)) python3 bench/gpu_realistic.py \
      --work-dir "$work" --out "$results/realistic" --budget-seconds "$realistic_seconds" \
      2>&1 | tee -a "$OUT/run.log" || echo "gpu_realistic: exit ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
  fi
  ;;
*)
  echo "usage: $0 wheels|device" >&2
  exit 2
  ;;
esac
