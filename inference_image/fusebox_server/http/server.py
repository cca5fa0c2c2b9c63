"""Process wiring: one event loop, two uvicorn servers, the worker and stats threads.

Why one process: the admin port must act on the very model and queues the
API port serves (unload, swap, breaker), so both share one Runtime. uvicorn's
own signal capture assumes one server per process; here SIGTERM/SIGINT stop
both servers: for CLOSE_NOTICE_SECONDS every answer says `Connection: close`
(clients leave their keep-alive connections between requests), then they
stop accepting and let every request under way finish (up to the request
timeout, which bounds each one anyway), then the threads stop. The pod's
preStop sleep keeps the server accepting while its endpoint leaves the
Service, so no new connection reaches a closing server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence

import structlog
import uvicorn

from fusebox_contract.names import Fault
from fusebox_contract.wiring import CLOSE_NOTICE_SECONDS, FAULTS_ENV, drain_seconds
from fusebox_server.config import ConfigError, ServerConfig, parse_command_line
from fusebox_server.control.preflight import check_config, check_model_dirs, fit_to_context_window
from fusebox_server.control.runtime import Runtime
from fusebox_server.control.stats import StatsThread
from fusebox_server.http.admin import build_admin_app, read_token, wedge_event_loop_soon
from fusebox_server.http.app import build_api_app
from fusebox_server.http.logs import configure_logging
from fusebox_server.model.faults import Faults, parse_faults

log = structlog.get_logger("fusebox_server")


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to us."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _uvicorn_server(app: object, host: str, port: int, drain: int) -> _Server:
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=drain,
    )
    return _Server(config)


async def serve(config: ServerConfig, faults: Faults, admin_token: str | None) -> int:
    loop = asyncio.get_running_loop()
    runtime = Runtime(config, faults)
    runtime.start(loop)
    stats = StatsThread(config.stats_file, runtime.stats_document, runtime.check_memory_guard)
    stats.start()
    drain = drain_seconds(config.request_timeout_seconds)
    servers = [
        _uvicorn_server(build_api_app(runtime), config.host, config.port, drain),
        _uvicorn_server(
            build_admin_app(runtime, admin_token), config.host, config.admin_port, drain
        ),
    ]
    exit_code = 0

    def shut_down() -> None:
        for server in servers:
            server.should_exit = True

    def on_signal(number: int) -> None:
        if runtime.stopping:
            # A second signal: stop at once, without waiting for the requests under way.
            shut_down()
            for server in servers:
                server.force_exit = True
            return
        runtime.stopping = True
        log.info(
            "shutting_down",
            signal=signal.Signals(number).name,
            close_notice_seconds=CLOSE_NOTICE_SECONDS,
            drain_seconds=drain,
        )
        loop.call_later(CLOSE_NOTICE_SECONDS, shut_down)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    async def load_primary() -> None:
        nonlocal exit_code
        try:
            await runtime.load_primary()
        except Exception as error:
            log.error("model_load_failed", model_dir=str(config.model_dir), error=repr(error))
            exit_code = 1
            shut_down()
            return
        if faults.value(Fault.WEDGE) >= 1:
            wedge_event_loop_soon()

    heartbeat = asyncio.create_task(runtime.beat_loop())
    loader = asyncio.create_task(load_primary())
    log.info(
        "server_starting",
        model_name=config.model_name,
        model_revision=config.model_revision,
        dtype=config.dtype.value,
        fallback_configured=config.fallback_configured,
        fallback_unavailable_reason=runtime.variants.unavailable_reason,
        torch_threads=config.torch_threads,
        context_window_tokens=config.context_window_tokens,
        max_input_tokens=config.max_input_tokens,
        max_new_tokens=config.max_new_tokens,
        port=config.port,
        admin_port=config.admin_port,
        device=str(runtime.device),
        faults=faults.snapshot() if faults.armed else None,
        admin_enabled=admin_token is not None,
    )
    try:
        await asyncio.gather(*(server.serve() for server in servers))
    finally:
        loader.cancel()
        heartbeat.cancel()
        runtime.stop()
        stats.stop()
    if any(not server.started for server in servers) and exit_code == 0:
        exit_code = 1  # a port could not be bound
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; returns only on a configuration error (exit status 2) or after
    `--check-config` (0 when the configuration is valid)."""
    try:
        config, check_only = parse_command_line(sys.argv[1:] if argv is None else argv, os.environ)
        faults = Faults(parse_faults(os.environ.get(FAULTS_ENV, "")))
        if check_only:
            print(f"config ok: {check_config(config)}")
            return 0
        check_model_dirs(config)
        asked = config
        config = fit_to_context_window(config)
        token = read_token(config.admin_token_file)
    except (ConfigError, ValueError, OSError) as error:
        # The last line on stderr: the kubelet's termination message (FallbackToLogsOnError),
        # which the operator quotes in Ready (PodsFailing).
        print(f"fusebox_server: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    if (config.max_input_tokens, config.max_new_tokens) != (
        asked.max_input_tokens,
        asked.max_new_tokens,
    ):
        log.info(
            "token_limits_fitted",
            context_window_tokens=config.context_window_tokens,
            max_input_tokens=config.max_input_tokens,
            max_new_tokens=config.max_new_tokens,
            asked_max_input_tokens=asked.max_input_tokens,
            asked_max_new_tokens=asked.max_new_tokens,
        )
    code = asyncio.run(serve(config, faults, token))
    # Tearing down torch and transformers module by module takes seconds and
    # frees nothing the kernel would not: flush and leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
