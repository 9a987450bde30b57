"""What forwarding alone costs per call, under rollq's capturing proxy: forwarders side by side, in one run.

bench/capture.py's harness (the demo's simulated LLM in a process of its own, latency uniform in 0.5-1.5 x
``--latency``; ``--concurrency`` calls in flight from this process with aiohttp), rounds alternating the paths so
drift hits all alike, each forwarder in a process of its own whose CPU per call (user + system, psutil) is
reported per round:

- ``capture``: a worker's ``CaptureProxy`` with one open attempt (bench/capture.py's, the worker's garbage
  collector settings included); with ``--base COMMIT`` also ``capture_base``, that commit's;
- ``aiohttp``: the least an aiohttp server and client can do to forward a call (read the body, POST it upstream,
  read the answer, answer with it), on uvloop;
- ``uvicorn``: uvicorn's httptools protocol serving a bare ASGI callable, the same aiohttp client upstream;
- ``httptools``: httptools' parser under an asyncio protocol of the bench's own (the server
  side of rollq/worker/capture/httpserver.py, without its keep-alive timer, limits and streaming), aiohttp's client
  upstream: the proxy's floor until its client moved to httptools too;
- ``httptools_raw``: the same server, the upstream over bare protocols (below): what the client side costs;
- ``raw``: both sides over bare asyncio protocols on uvloop, HTTP read by hand for exactly what the simulated LLM
  and aiohttp's client send (a ``Content-Length`` body, keep-alive, no chunking, no TLS). Not a usable proxy: it
  only says what is left once no HTTP library runs in Python at all;
- ``rollq_http``: the capture proxy's own server and client (rollq/worker/capture/httpserver.py, httpclient.py)
  with a handler that forwards and answers, nothing read or recorded: the proxy less its capture.
- ``native``: bench/native_forwarder (hyper on one thread, outside Python; built with ``cargo --offline`` from
  Debian's packaged crates: ``apt-get install cargo librust-hyper-dev librust-tokio-dev``) forwards, and hands each
  call's request and answer to this script's process every 20 ms, which records them as the capture proxy does
  (the request and answer read into a ``CapturedCall``, its span): the lever "the proxy's per-call path out of
  Python", measured. Its CPU is both processes' (``children_cpu_ms_per_call``: the binary's). Not a usable proxy
  either: no streaming, gate, retries or request rewriting.

The gap between ``capture`` and ``rollq_http`` is rollq's capture per call (parsing the request and the answer,
the record, the span); between ``rollq_http`` and ``httptools_raw``, rollq's HTTP server and client over the bench's
bare ones; the gaps between ``httptools``, ``httptools_raw`` and ``raw`` are the HTTP libraries'.
``--prompt-chars N`` pads the user message to N characters: the simulated LLM's answer then carries N prompt token
ids, as a real backend's does for a prompt of N tokens (the default message gives a 0.4 kB answer). Every call
asks for token ids itself (``return_token_ids``), so that every forwarder gets the answers the capture proxy gets.

    python bench/proxy_floor.py [--calls 3072] [--concurrency 256] [--rounds 3] [--latency 0.5] [--base COMMIT]
                                [--only aiohttp httptools ...] [--prompt-chars N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.capture import Child, _child, _round, _start, _summary  # noqa: E402
from bench.common import base_tree, commit_of, cpu_split, write_result  # noqa: E402


def serve_aiohttp(backend: str) -> None:
    from aiohttp import web

    from rollq.worker.event_loop import new_event_loop

    async def main() -> None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        dropped = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}

        async def handle(request: web.BaseRequest) -> web.Response:
            raw = await request.read()
            headers = {"Content-Type": "application/json"}
            async with session.post(backend + "/chat/completions", data=raw, headers=headers) as upstream:
                data = await upstream.read()
                kept = {k: v for k, v in upstream.headers.items() if k.lower() not in dropped}
                return web.Response(body=data, status=upstream.status, headers=kept)

        runner = web.ServerRunner(web.Server(handle, access_log=None))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(f"http://127.0.0.1:{port}/v1", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await session.close()

    new_event_loop().run_until_complete(main())


def _aiohttp_upstream(backend: str) -> tuple[Any, Any]:
    """An aiohttp client session and a coroutine function that POSTs a body upstream: (status, headers, data)."""
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    dropped = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}

    async def post(raw: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        headers = {"Content-Type": "application/json"}
        async with session.post(backend + "/chat/completions", data=raw, headers=headers) as upstream:
            data = await upstream.read()
            kept = [(k.encode(), v.encode()) for k, v in upstream.headers.items() if k.lower() not in dropped]
            return upstream.status, kept, data

    return session, post


def serve_uvicorn(backend: str) -> None:
    """uvicorn's httptools protocol serving a bare ASGI callable; aiohttp's client upstream."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from rollq.worker.event_loop import new_event_loop

    async def main() -> None:
        session, post = _aiohttp_upstream(backend)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            raw = b""
            while True:
                message = await receive()
                raw += message.get("body", b"")
                if not message.get("more_body"):
                    break
            status, headers, data = await post(raw)
            headers.append((b"content-length", b"%d" % len(data)))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": data})

        config = Config(app, http="httptools", lifespan="off", access_log=False, log_config=None, proxy_headers=False,
                        server_header=False, date_header=False)  # fmt: skip
        config.load()
        state = ServerState()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: HttpToolsProtocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0
        )
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        await session.close()

    new_event_loop().run_until_complete(main())


def serve_httptools(backend: str, upstream: str = "aiohttp") -> None:
    """httptools' parser under an asyncio protocol of the bench's own (Content-Length answers); upstream aiohttp's
    client, or (``raw``) bare protocols."""
    import httptools

    from rollq.worker.event_loop import new_event_loop

    async def main() -> None:
        session, post = _aiohttp_upstream(backend)
        raw_forward = _raw_upstream(backend) if upstream == "raw" else None

        class Server(asyncio.Protocol):
            def __init__(self) -> None:
                self.parser = httptools.HttpRequestParser(self)
                self.transport: Any = None
                self.body: list[bytes] = []
                self.url = b""
                self.headers: list[tuple[bytes, bytes]] = []

            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                self.parser.feed_data(data)

            def on_message_begin(self) -> None:
                self.body, self.url, self.headers = [], b"", []

            def on_url(self, url: bytes) -> None:
                self.url += url

            def on_header(self, name: bytes, value: bytes) -> None:
                self.headers.append((name, value))

            def on_body(self, body: bytes) -> None:
                self.body.append(body)

            def on_message_complete(self) -> None:
                asyncio.get_running_loop().create_task(self.answer(b"".join(self.body)))

            async def answer(self, raw: bytes) -> None:
                if raw_forward is not None:
                    self.transport.write(await raw_forward(raw))
                    return
                status, headers, data = await post(raw)
                head = [b"HTTP/1.1 %d OK\r\n" % status]
                head += [b"%s: %s\r\n" % h for h in headers]
                head.append(b"content-length: %d\r\n\r\n" % len(data))
                self.transport.write(b"".join(head) + data)

        loop = asyncio.get_running_loop()
        server = await loop.create_server(Server, "127.0.0.1", 0)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        await session.close()

    new_event_loop().run_until_complete(main())


def serve_rollq_http(backend: str) -> None:
    """rollq's own server and client (rollq/worker/capture/httpserver.py and httpclient.py) with a handler that
    forwards the body and answers with the backend's answer, nothing read or recorded: the capture proxy less its
    capture."""
    from rollq.worker.capture.httpclient import Client
    from rollq.worker.capture.httpserver import Request, Response, Server
    from rollq.worker.event_loop import new_event_loop

    dropped = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}

    async def main() -> None:
        client = Client(connect_timeout=30, read_timeout=600)
        url = backend + "/chat/completions"

        async def handle(request: Request) -> Response:
            upstream = await client.post(url, data=await request.read(), headers={"content-type": "application/json"})
            try:
                data = await upstream.read()
            finally:
                upstream.release()
            kept = [(k, v) for k, v in upstream.header_list if k.lower() not in dropped]
            return Response(body=data, status=upstream.status, headers=kept)

        server = Server(handle, max_body_bytes=32 * 1024 * 1024)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await server.start(sock)
        print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.close()
        await client.close()

    new_event_loop().run_until_complete(main())


def _message_end(buffer: bytearray) -> int:
    """Where the first whole Content-Length message in ``buffer`` ends, or -1 (measurement only: see above)."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        return -1
    head = bytes(buffer[:head_end]).lower()
    at = head.find(b"content-length:")
    length = int(head[at + 15 : head.find(b"\r\n", at) if head.find(b"\r\n", at) >= 0 else None]) if at >= 0 else 0
    end = head_end + 4 + length
    return end if len(buffer) >= end else -1


def _raw_upstream(backend: str) -> Any:
    """A coroutine function that POSTs a body upstream over bare asyncio protocols and returns the whole answer
    as it came (status line, headers, Content-Length body): measurement only, see the module docstring."""
    parts = urlsplit(backend)
    path = (parts.path + "/chat/completions").encode()
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.buffer = bytearray()
            self.waiter: asyncio.Future[bytes] | None = None
            self.transport: Any = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            end = _message_end(self.buffer)
            if end >= 0 and self.waiter is not None:
                answer = bytes(self.buffer[:end])
                del self.buffer[:end]
                self.waiter.set_result(answer)

    idle: list[Upstream] = []

    async def forward(body: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        if idle:
            upstream = idle.pop()
        else:
            _, upstream = await loop.create_connection(Upstream, host, port)
        upstream.waiter = loop.create_future()
        head = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        upstream.transport.write(head % (path, parts.netloc.encode(), len(body)) + body)
        answer = await upstream.waiter
        idle.append(upstream)
        return answer

    return forward


def serve_raw(backend: str) -> None:
    from rollq.worker.event_loop import new_event_loop

    forward = _raw_upstream(backend)

    class Server(asyncio.Protocol):
        def __init__(self) -> None:
            self.buffer = bytearray()
            self.transport: Any = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := _message_end(self.buffer)) >= 0:
                body = bytes(self.buffer[self.buffer.find(b"\r\n\r\n") + 4 : end])
                del self.buffer[:end]
                asyncio.get_running_loop().create_task(self.answer(body))

        async def answer(self, body: bytes) -> None:
            self.transport.write(await forward(body))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", 0)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    new_event_loop().run_until_complete(main())


NATIVE_DIR = Path(__file__).resolve().parent / "native_forwarder"
NATIVE_BINARY = NATIVE_DIR / "target" / "release" / "rollq-bench-native-forwarder"
NATIVE_FLUSH_MS = 20
"""How often the native forwarder hands the calls finished since its last hand-over to Python."""
_FRAME = struct.Struct("<QQHIII")


def build_native() -> Path:
    """bench/native_forwarder's binary, built (offline, from Debian's packaged crates) when missing or older than
    its sources; a clear error naming what to install when it cannot be."""
    sources = [*NATIVE_DIR.glob("src/*.rs"), NATIVE_DIR / "Cargo.toml"]
    if NATIVE_BINARY.exists() and all(NATIVE_BINARY.stat().st_mtime >= s.stat().st_mtime for s in sources):
        return NATIVE_BINARY
    if shutil.which("cargo") is None:
        raise SystemExit("the native forwarder needs cargo (Debian: apt-get install cargo); or leave out `native`")
    built = subprocess.run(
        ["cargo", "build", "--release", "--offline", "--quiet"], cwd=NATIVE_DIR, capture_output=True, text=True
    )
    if built.returncode != 0:
        raise SystemExit(
            "could not build bench/native_forwarder (it takes hyper and tokio from Debian's packages: "
            f"apt-get install librust-hyper-dev librust-tokio-dev); or leave out `native`:\n{built.stderr[-2000:]}"
        )
    return NATIVE_BINARY


def _native_calls(buffer: bytearray) -> list[tuple[int, int, int, bytes, bytes, bytes]]:
    """The whole frames at the head of ``buffer`` (bench/native_forwarder/src/main.rs's format), taken off it."""
    calls, at = [], 0
    while len(buffer) - at >= _FRAME.size:
        start_ns, end_ns, status, path_len, request_len, answer_len = _FRAME.unpack_from(buffer, at)
        end = at + _FRAME.size + path_len + request_len + answer_len
        if len(buffer) < end:
            break
        body = at + _FRAME.size + path_len
        path = bytes(buffer[at + _FRAME.size : body])
        calls.append(
            (
                start_ns,
                end_ns,
                status,
                path,
                bytes(buffer[body : body + request_len]),
                bytes(buffer[body + request_len : end]),
            )
        )
        at = end
    del buffer[:at]
    return calls


def serve_native(backend: str) -> None:
    """bench/native_forwarder (hyper, outside Python) forwards; this process records each call as the capture
    proxy does (the request read, the answer read into a ``CapturedCall``, the call's span under the rollout), from
    the batches the forwarder hands over every ``NATIVE_FLUSH_MS``. Its CPU is this process's and the forwarder's."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from bench.capture import _release_spans
    from rollq.worker.capture import answers, codec, tokens
    from rollq.worker.capture.calls import CallKind, CapturedCall
    from rollq.worker.capture.spans import record_span
    from rollq.worker.tracer import OtelTracer

    binary = build_native()
    tracer = OtelTracer(TracerProvider())
    rollout = tracer.start_rollout("bench", 1)
    parent, capture_tracer = trace.set_span_in_context(rollout.root), tracer.capture_tracer()
    forwarder = subprocess.Popen(
        [str(binary), "--backend", backend, "--flush-ms", str(NATIVE_FLUSH_MS)], stdout=subprocess.PIPE
    )
    assert forwarder.stdout is not None
    print(forwarder.stdout.readline().decode().strip(), flush=True)
    recorded = 0

    def record() -> None:
        nonlocal recorded
        assert forwarder.stdout is not None
        fd, buffer = forwarder.stdout.fileno(), bytearray()
        while data := os.read(fd, 1 << 22):
            buffer += data
            for start_ns, end_ns, status, path, request, answer in _native_calls(buffer):
                body = codec.loads(request)
                call = CapturedCall(
                    kind=CallKind.CHAT,
                    resource="llm",
                    path=path.decode(),
                    start_ns=start_ns,
                    request_model=body.get("model") if isinstance(body.get("model"), str) else None,
                    messages=body.get("messages"),
                    streamed=bool(body.get("stream")),
                )
                if not answers.read_whole(call, answer):
                    tokens.read_response(call, codec.loads(answer))
                call.end_ns, call.status = end_ns, status
                record_span(capture_tracer, call, parent)
                recorded += 1

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    done = threading.Event()  # the calls' spans let go every second, as bench/capture.py's proxy process does
    released = threading.Thread(target=_release_spans, args=(rollout, done), daemon=True)
    released.start()
    sys.stdin.read()
    done.set()
    released.join()
    forwarder.terminate()
    forwarder.wait(10)
    recorder.join(10)
    print(f"recorded {recorded} calls", file=sys.stderr)


SERVE = {
    "aiohttp": serve_aiohttp,
    "uvicorn": serve_uvicorn,
    "httptools": serve_httptools,
    "httptools_raw": functools.partial(serve_httptools, upstream="raw"),
    "raw": serve_raw,
    "rollq_http": serve_rollq_http,
    "native": serve_native,
}
FORWARDERS = tuple(SERVE)


async def measure(proxies: dict[str, Child], args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    latencies: dict[str, list[float]] = {name: [] for name in proxies}
    cpu = dict.fromkeys(proxies, 0.0)
    children_cpu = dict.fromkeys(proxies, 0.0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for child in proxies.values():
            await _round(session, child.line, args.concurrency, args.concurrency, args.prompt_chars, True)  # warm
        per_round = args.calls // args.rounds
        for n in range(args.rounds):
            row: dict[str, Any] = {"round": n + 1}
            names = list(proxies)
            for name in names[n % len(names) :] + names[: n % len(names)]:
                process = psutil.Process(proxies[name].proc.pid)
                before = cpu_split(process)
                values, _ = await _round(
                    session, proxies[name].line, per_round, args.concurrency, args.prompt_chars, token_ids=True
                )
                after = cpu_split(process)
                used = sum(after) - sum(before)
                cpu[name] += used
                children_cpu[name] += after[1] - before[1]
                latencies[name] += values
                row[f"{name}_cpu_ms_per_call"] = round(used * 1000 / len(values), 3)
            rounds.append(row)
    summary: dict[str, Any] = {
        name: {**_summary(values), "cpu_ms_per_call": round(cpu[name] * 1000 / len(values), 3)}
        for name, values in latencies.items()
    }
    for name, seconds in children_cpu.items():
        if seconds:  # the native forwarder's binary, beside the Python process that records its calls
            summary[name]["children_cpu_ms_per_call"] = round(seconds * 1000 / len(latencies[name]), 3)
    summary["rounds"] = rounds
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3072, help="calls per path (default 3072)")
    parser.add_argument("--concurrency", type=int, default=256, help="calls in flight (default 256)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--latency", type=float, default=0.5, help="mean backend latency per call, s (default 0.5)")
    parser.add_argument(
        "--prompt-chars",
        type=int,
        default=0,
        help="the user message padded to this many characters; the answer has a prompt token id per byte",
    )
    parser.add_argument("--only", nargs="*", choices=FORWARDERS, help="forwarders beside capture (default all)")
    parser.add_argument("--base", help="also the capture proxy of this commit (a temporary git worktree)")
    parser.add_argument("--out", default="", help="also write bench/results/<out>.json (default: print only)")
    parser.add_argument("--serve", choices=FORWARDERS, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return SERVE[args.serve](args.backend)
    with base_tree(args.base) as tree:
        backend, direct = _child("--serve", "backend", "--latency", str(args.latency))
        proxies: dict[str, Child] = {}
        try:
            proxies["capture"] = _start("--serve", "proxy", "--backend", direct)
            if tree is not None:
                proxies["capture_base"] = _start("--serve", "proxy", "--backend", direct, tree=tree)
            for kind in FORWARDERS if args.only is None else args.only:
                proxies[kind] = _start("--serve", kind, "--backend", direct, script="proxy_floor.py")
            data = asyncio.run(measure(proxies, args))
        finally:
            for proc in [child.proc for child in proxies.values()] + [backend]:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(10)
    if args.base:
        data["base_commit"] = commit_of(args.base)
    print(json.dumps(data, indent=2))
    if args.out:
        write_result(args.out, data, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
