"""A small TCP proxy that delays every byte by half a round trip each way: network latency without netem.

Run: python bench/delay_proxy.py --listen 127.0.0.1:6380 --upstream 10.231.1.1:6379 --rtt-ms 2 [--jitter-ms 0.2]
     [--stats FILE]

bench/cluster/ runs one per simulated host, inside the host's network namespace. Each chunk read
from one side is written to the other side ``rtt/2 (+ U(0, jitter))`` later, never before an earlier
chunk (order kept). With ``--rtt-ms 0`` chunks are forwarded at once, which is how the proxy's own
cost is measured against the direct path. asyncio's timers wait in whole milliseconds (epoll), so a
sub-millisecond delay comes out at about 1 ms each way: bench/cluster/ measures the round trip it
actually got and reports that. ``--stats`` gets, four times a second, the chunks and bytes seen each way.
``--rtt-file`` (a file holding "rtt_ms jitter_ms") overrides ``--rtt-ms``/``--jitter-ms`` and is read
again four times a second, so one run of worker processes can be measured at several round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
from pathlib import Path


class Delay:
    """Half the round trip and half the jitter, in seconds, as the proxy applies them now."""

    def __init__(self, rtt_ms: float, jitter_ms: float) -> None:
        self.set(rtt_ms, jitter_ms)

    def set(self, rtt_ms: float, jitter_ms: float) -> None:
        self.delay, self.jitter = rtt_ms / 2000, jitter_ms / 2000


class Counters:
    def __init__(self) -> None:
        self.up_chunks = self.up_bytes = self.down_chunks = self.down_bytes = self.connections = 0


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, d: Delay, fixed: bool, up: bool, c: Counters
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send_later() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    # A fixed zero delay forwards at once (the proxy's own cost); a delay that may change always queues.
    sender = asyncio.create_task(send_later()) if d.delay > 0 or not fixed else None
    last_due = 0.0
    try:
        while True:
            data = await reader.read(1 << 16)
            if up:
                c.up_chunks, c.up_bytes = c.up_chunks + 1, c.up_bytes + len(data)
            else:
                c.down_chunks, c.down_bytes = c.down_chunks + 1, c.down_bytes + len(data)
            if sender is None:
                if not data:
                    break
                writer.write(data)
                await writer.drain()
                continue
            last_due = max(last_due, loop.time() + d.delay + random.uniform(0, d.jitter))
            queue.put_nowait((last_due, data))
            if not data:
                await sender
                break
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        if sender is not None and not sender.done():
            sender.cancel()
        writer.close()


def nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--rtt-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--stats")
    parser.add_argument("--rtt-file")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    up_host, up_port = args.upstream.rsplit(":", 1)
    delay = Delay(args.rtt_ms, args.jitter_ms)
    fixed = args.rtt_file is None
    counters = Counters()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        counters.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            client_writer.close()
            return
        nodelay(client_writer)
        nodelay(server_writer)
        await asyncio.gather(
            pump(client_reader, server_writer, delay, fixed, True, counters),
            pump(server_reader, client_writer, delay, fixed, False, counters),
        )

    server = await asyncio.start_server(handle, host, int(port), backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)

    async def report() -> None:
        while True:
            if args.rtt_file:
                try:
                    rtt_ms, jitter_ms = (float(x) for x in Path(args.rtt_file).read_text().split())
                    delay.set(rtt_ms, jitter_ms)
                except (OSError, ValueError):
                    pass  # being rewritten: keep the delay in force
            if args.stats:
                tmp = Path(args.stats + ".tmp")
                tmp.write_text(json.dumps(vars(counters)))
                tmp.replace(args.stats)
            await asyncio.sleep(0.25)

    reporter = asyncio.create_task(report())
    async with server:
        await stop.wait()
    reporter.cancel()


if __name__ == "__main__":
    asyncio.run(main())
