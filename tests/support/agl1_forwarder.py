"""A TCP load balancer for the tests: each connection goes to the first of several backends that accepts it.

What a deployment puts in front of several ``serve-agl`` hosts; with it, AL 1.0's own clients (which
retry a failed GET at once, without backoff) ride through one host being killed and restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class Forwarder:
    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> Forwarder:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.run_until_complete(asyncio.start_server(self._handle, sock=sock))
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, daemon=True, name="agl1-forwarder").start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(50):  # every backend down: keep trying for ~10 s, as a balancer's retry budget
            for port in self.backends:
                try:
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
                except OSError:
                    continue
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                return
            await asyncio.sleep(0.2)
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
