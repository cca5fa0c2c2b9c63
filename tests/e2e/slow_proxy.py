"""A TCP proxy that passes the upstream's answers on at a fixed rate: a slow model store.

Why: the tiny model downloads in a blink inside the lab, so nothing could see a
download under way. Run in a pod next to the S3 gateway (`python slow_proxy.py
LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT BYTES_PER_SECOND`), it makes a download
last long enough for the operator to tell its bytes and rate while it runs. The
bytes are passed on unchanged (an S3 signature covers the Host header the client
sent, which a TCP proxy does not touch). One rate for all connections together:
a client that opens several at once is not faster. Stdlib only: it runs in the
operator's image.
"""

from __future__ import annotations

import asyncio
import sys
import time

CHUNK_BYTES = 16 * 1024


class Pacer:
    """Hands out send times so that all connections together keep to one rate."""

    def __init__(self, bytes_per_second: float) -> None:
        self._rate = bytes_per_second
        self._next = time.monotonic()

    async def wait(self, count: int) -> None:
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + count / self._rate
        await asyncio.sleep(self._next - now)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pacer: Pacer | None
) -> None:
    try:
        while data := await reader.read(CHUNK_BYTES):
            if pacer is not None:
                await pacer.wait(len(data))
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(port: int, host: str, upstream_port: int, rate: float) -> None:
    pacer = Pacer(rate)

    async def handle(client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection(host, upstream_port)
        except OSError:
            client.close()
            return
        await asyncio.gather(
            _pipe(client_reader, upstream, None), _pipe(upstream_reader, client, pacer)
        )

    server = await asyncio.start_server(handle, "0.0.0.0", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen, upstream_host, upstream_port, rate = sys.argv[1:5]
    asyncio.run(main(int(listen), upstream_host, int(upstream_port), float(rate)))
