"""bench/gpu_realistic.py's phases that run in a child process: the model, the engine, `generate`.

Why apart from the script: each of these holds torch and the model in its
own process (its own CUDA context, freed when it ends, killed at its share
of the budget), and writes its part file as it goes so a cut phase still
reports what it measured. The script only starts them (`--child PHASE`)
and reads their part files.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from bench.gpu_realistic_config import RealisticConfig, llama_config
from bench.gpu_realistic_traffic import request_from_json
from bench.serving_metrics import ResponseRecord, summarize
from bench.workload import WorkloadRequest


def build_model(config: RealisticConfig, work_dir: Path) -> dict[str, Any]:
    """The model directory under work_dir, made once; returns what was built and how long
    each step took. Weights are initialised on the device in the served dtype (8 B
    parameters in float32 would be 32 GB before any cast)."""
    import torch
    import transformers

    from fusebox_server.zoo.families import FAMILIES
    from fusebox_server.zoo.release import SEED, _as_released
    from fusebox_server.zoo.tokenizer_training import transformers_tokenizer

    fields_of = llama_config(config.sizes, config.vocab_size)
    name = f"llama31-{fields_of['num_hidden_layers']}x{fields_of['hidden_size']}-{config.dtype}"
    target = work_dir / name
    marker = target / "realistic-model.json"
    if marker.exists():
        built: dict[str, Any] = json.loads(marker.read_text())
        return built | {"dir": str(target), "reused": True}
    family = FAMILIES["llama3"]
    tokenizer = transformers_tokenizer(family)
    dtype = getattr(torch, config.dtype)
    started = time.perf_counter()
    torch.manual_seed(SEED)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(config.device):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields_of))
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype)  # a no-op when the default dtype took
    quiet_unused_ids(model, tokenizer, family.special_tokens.values())
    model.generation_config.eos_token_id = list(family.generation_eos)
    model.generation_config.bos_token_id = fields_of["bos_token_id"]
    model.config.dtype = config.dtype
    if config.device.startswith("cuda"):
        torch.cuda.synchronize()
    init_seconds = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=work_dir))
    started = time.perf_counter()
    model.save_pretrained(staging, max_shard_size="5GB")
    tokenizer.save_pretrained(staging)
    _as_released(staging, family)
    save_seconds = time.perf_counter() - started
    device_bytes = (
        torch.cuda.get_device_properties(0).total_memory
        if config.device.startswith("cuda")
        else os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    )
    built = {
        "config": fields_of,
        "dtype": config.dtype,
        "parameters": parameters,
        "weight_bytes": weight_bytes,
        "device_memory_bytes": device_bytes,
        "init_seconds": init_seconds,
        "save_seconds": save_seconds,
        "shards": len(list(staging.glob("model-*.safetensors"))) or 1,
    }
    (staging / "realistic-model.json").write_text(json.dumps(built, indent=2) + "\n")
    del model
    if target.exists():
        import shutil

        shutil.rmtree(target)
    os.replace(staging, target)
    return built | {"dir": str(target), "reused": False}


def quiet_unused_ids(model: Any, tokenizer: Any, special_ids: Any) -> None:
    """Zero the output rows of the special ids and of every id the tokenizer lacks (on the
    model's device), so greedy text is ordinary text and never ends early."""
    import torch

    weight = model.get_output_embeddings().weight
    used = sorted(set(tokenizer.get_vocab().values()) - set(special_ids))
    silent = torch.ones(weight.shape[0], dtype=torch.bool, device=weight.device)
    silent[torch.tensor(used, device=weight.device)] = False
    with torch.no_grad():
        weight[silent] = 0.0


def child_phase(phase: str, spec: dict[str, Any], part_path: Path) -> None:
    """Run `phase` ("build", "engine" or "generate") with its spec; its part file is its
    result."""
    if phase == "build":
        config = RealisticConfig(**spec["config"])
        write_part(part_path, build_model(config, Path(spec["work_dir"])))
    elif phase == "engine":
        engine_child(spec, part_path)
    elif phase == "generate":
        generate_child(spec, part_path)
    else:
        raise SystemExit(f"no child phase {phase!r}")


def server_worker_settings(model_dir: Path, device: str) -> dict[str, int]:
    """The worker settings the server runs with by default on `device` (its prefix cache's
    bound, its prefill chunk as resolved for the device), so the engine in process is the
    same worker the HTTP phase measured, not one that prefills differently."""
    from fusebox_server.config import ServerConfig, prefill_chunk_tokens_for

    defaults = ServerConfig(model_dir=model_dir)
    device_type = device.split(":")[0]
    return {
        "prefix_cache_bytes": defaults.prefix_cache_bytes,
        "prefill_chunk_tokens": prefill_chunk_tokens_for(
            device_type, defaults.prefill_chunk_tokens
        ),
    }


def engine_child(spec: dict[str, Any], part_path: Path) -> None:
    """Fusebox's worker in this process, at each client count: the server's ceiling."""
    import torch

    from fusebox_contract.names import Dtype, Quantization
    from fusebox_server.model.decode_settings import DecodeSettings
    from fusebox_server.model.engine import load_model
    from fusebox_server.model.faults import Faults
    from fusebox_server.model.tokenization import load_tokenizer
    from fusebox_server.model.worker import Finished, GenerationJob, InferenceWorker, Piece

    config = RealisticConfig(**spec["config"])
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    model_dir = Path(spec["model_dir"])
    tokenizer = load_tokenizer(model_dir)

    def encoded(requests: list[dict[str, Any]]) -> list[tuple[WorkloadRequest, tuple[int, ...]]]:
        """Each request with its prompt's ids, as the server's chat template makes them."""
        pairs = []
        for data in requests:
            request = request_from_json(data)
            ids = tokenizer.apply_chat_template(
                request.messages(), add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            pairs.append((request, tuple(ids)))
        return pairs

    warmup = encoded(spec["warmup"])
    by_clients = {int(count): encoded(requests) for count, requests in spec["closed"].items()}
    started = time.perf_counter()
    loaded = load_model(
        "primary",
        model_dir,
        Quantization.NONE,
        torch.device(config.device),
        tokenizer,
        Dtype(config.dtype),
    )
    part: dict[str, Any] = {"load_seconds": time.perf_counter() - started, "closed": {}}
    settings = server_worker_settings(model_dir, config.device)

    async def rounds() -> None:
        loop = asyncio.get_running_loop()
        worker = InferenceWorker(
            loop,
            Faults({}),
            inbox_size=max(config.clients) + 64,
            torch_threads=config.threads,
            **settings,
        )
        worker.loaded = loaded
        worker.start()

        async def one(
            request: WorkloadRequest, ids: tuple[int, ...], record: ResponseRecord
        ) -> None:
            done: asyncio.Future[Any] = loop.create_future()

            def deliver(event: Any) -> None:
                now = time.perf_counter()
                if isinstance(event, Piece):
                    if event.text:
                        record.chunk_times.append(now)
                        record.text += event.text
                elif not done.done():
                    done.set_result(event)

            record.sent = time.perf_counter()
            worker.submit(
                GenerationJob(
                    request_id=str(request.index),
                    variant="primary",
                    prompt_ids=ids,
                    settings=DecodeSettings(request.max_tokens, 0.0, 1.0, None, ()),
                    deadline_monotonic=time.monotonic() + config.request_timeout_seconds,
                    tokenizer=tokenizer,
                    deliver=deliver,  # the worker posts each event onto this loop
                )
            )
            event = await done
            record.finished = time.perf_counter()
            if isinstance(event, Finished):
                record.finish_reason = event.reason
                record.completion_tokens = event.completion_tokens
                record.prompt_tokens = len(ids)
            else:
                record.error = repr(getattr(event, "error", event))

        async def closed(
            count: int, pairs: list[tuple[WorkloadRequest, tuple[int, ...]]]
        ) -> list[ResponseRecord]:
            queue = list(reversed(pairs))
            records: list[ResponseRecord] = []

            async def client() -> None:
                while queue:
                    request, ids = queue.pop()
                    record = ResponseRecord(request.index, scheduled=time.perf_counter())
                    records.append(record)
                    await one(request, ids, record)

            await asyncio.gather(*(client() for _ in range(count)))
            return records

        await closed(len(warmup), warmup)  # as the server's warm-up: its system prompt cached
        for count in config.clients:
            records = await closed(count, by_clients[count])
            part["closed"][str(count)] = summarize(records) | {"offered": len(by_clients[count])}
            write_part(part_path, part)
        worker.stop()

    asyncio.run(rounds())
    write_part(part_path, part)


def generate_child(spec: dict[str, Any], part_path: Path) -> None:
    """`generate` with a static cache, compiled: c=1, then one static batch. Everything runs
    in inference mode: a static cache filled there can only be reset there."""
    import torch

    with torch.inference_mode():
        _generate_baselines(spec, part_path)


def _generate_baselines(spec: dict[str, Any], part_path: Path) -> None:
    import torch
    import transformers

    config = RealisticConfig(**spec["config"])
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    model_dir = Path(spec["model_dir"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    started = time.perf_counter()
    auto: Any = transformers.AutoModelForCausalLM
    model = (
        auto.from_pretrained(
            str(model_dir), local_files_only=True, dtype=getattr(torch, config.dtype)
        )
        .to(config.device)
        .eval()
    )
    part: dict[str, Any] = {
        "load_seconds": time.perf_counter() - started,
        "compiled": config.compile_generate,
        "cache": "static",
    }
    compile_config = transformers.CompileConfig(mode="reduce-overhead")
    if config.compile_generate:
        cast(
            Any, compile_config
        )._compile_all_devices = True  # generate compiles on CUDA; also elsewhere
    generation = {
        "do_sample": False,
        "compile_config": compile_config,
        "disable_compile": not config.compile_generate,
    }
    c1 = [request_from_json(r) for r in spec["c1"]]
    headline = spec["closed"][str(config.clients[0])]
    batch = [request_from_json(r) for r in headline][: config.static_batch_rows]
    longest = max(r.prompt_tokens for r in [*c1, *batch]) + 64  # the template's tokens
    cache_len = longest + max(r.max_tokens for r in [*c1, *batch])

    def sync() -> None:
        if config.device.startswith("cuda"):
            torch.cuda.synchronize()

    def encode(requests: Sequence[WorkloadRequest]) -> Any:
        texts = [
            tokenizer.apply_chat_template(r.messages(), add_generation_prompt=True, tokenize=False)
            for r in requests
        ]
        return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            config.device
        )

    single: Any = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
    latencies, texts = [], []
    for position, request in enumerate(c1):
        inputs = encode([request])
        single.reset()
        sync()
        began = time.perf_counter()
        output = model.generate(
            **inputs, max_new_tokens=request.max_tokens, cache=single, **generation
        )
        sync()
        seconds = time.perf_counter() - began
        text = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        if position:
            latencies.append(seconds)
            texts.append({"index": request.index, "text": text, "seconds": seconds})
        else:
            part["c1_first_seconds_with_compile"] = seconds
        part["c1"] = {
            "latency_seconds": latencies,
            "median_latency_seconds": statistics.median(latencies) if latencies else None,
            "responses": texts,
        }
        write_part(part_path, part)
    inputs = encode(batch)
    most = max(r.max_tokens for r in batch)
    cache: Any = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
    for name in ("warmup", "measured"):
        cache.reset()
        sync()
        began = time.perf_counter()
        output = model.generate(**inputs, max_new_tokens=most, cache=cache, **generation)
        sync()
        seconds = time.perf_counter() - began
        # Each row's own max_tokens counts; the batch runs to its longest, the rest is waste.
        useful = sum(r.max_tokens for r in batch)
        part[f"static_batch_{name}"] = {
            "rows": len(batch),
            "seconds": seconds,
            "useful_tokens": useful,
            "generated_tokens": int((output.shape[1] - inputs["input_ids"].shape[1]) * len(batch)),
            "tokens_per_second": useful / seconds,
        }
        write_part(part_path, part)


def write_part(path: Path, part: dict[str, Any]) -> None:
    """A child's part file: rewritten whole after each step, so the parent reads what was
    measured even when it killed the child mid-step."""
    write_atomically(path, json.dumps(part, ensure_ascii=False, indent=1) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """`text` at `path` by a rename, so a reader never sees half a file."""
    staging = path.with_suffix(path.suffix + ".tmp")
    staging.write_text(text)
    os.replace(staging, path)
