"""Agent Lightning 1.0 agent classes in rollq workers, unchanged.

An AL 1.0 agent is a plain class whose ``run()`` (async or not) reads its task from the
environment: the names of ``config.local.env_map`` (``QUESTION`` from ``input.question``...),
``AGL_OPENAI_BASE_URL`` (an OpenAI base URL for its LLM calls), ``AGL_EVENT_URL`` (where it posts
events such as ``{"event_type": "reward", "data": {"value": 1.0}}``) and ``AGL_KEY``.
:class:`Agl1Agent` is a rollq ``LitAgent`` that gives it exactly that, per rollout:

- ``AGL_OPENAI_BASE_URL`` leads to this process's :class:`AgentEndpoint`, which applies AL's proxy
  rules (served model name, the mode's temperature, logprobs in train mode; 429 while
  ``/proxy/pause`` is on; streaming refused) and forwards to rollq's capturing proxy, so every call
  becomes a span with the exact token ids (the rollout's triplets) and an AL ``model_request`` event;
- ``AGL_EVENT_URL`` leads to the same endpoint, which keeps the attempt's events;
- when ``run()`` returns, the last ``reward`` event's value is emitted as a rollq reward after the
  last call, so it lands on the last triplet and becomes the final reward (as AL's trainer reads
  it), and the events are published with the rollout (``metadata["agl1_events"]``) for
  ``serve-agl``'s ``GET /api/rollouts/{id}/events``.

Which classes may run is the worker's own configuration, never the task's: ``AGL1_AGENT_CLASS``
names one or more (``module:Class`` or ``module.Class``, comma-separated), loaded when the worker
starts; a rollout's ``config.local.agent_class`` only picks among them (the same name, or one a
dotted suffix of the other) and a rollout naming another fails, saying so.

Isolation (``AGL1_ISOLATION``): ``process`` (default) runs each rollout in a child Python
process as AL's local controller does (its own environment, any number in flight per worker, a
crash or ``os._exit`` fails only that rollout; ~0.1-0.5 s to start); ``inline`` runs ``run()`` in
the worker itself with ``os.environ`` set for it, one rollout at a time per process (the
environment is process-wide), for agents whose start-up cost matters more.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import redis
from aiohttp import web

from rollq.models.contract import LLM, NamedResources, Rollout
from rollq.models.errors import RollqError
from rollq.store.keys import Keys
from rollq.worker.agent import LitAgent
from rollq.worker.loader import load_object
from rollq.worker.tracer import emit_reward

from .keys import Agl1Keys
from .mapping import EVENTS_METADATA_KEY, opened
from .store import INFLIGHT_LEASE_SECONDS, PROXY_SETTINGS_KEY, RESOURCE_PREFIX
from .upstream import (
    PROXY_PATHS,
    ProxySettings,
    UpstreamError,
    model_request_data,
    pop_routed_experts,
    send,
    sticky_index,
)

log = logging.getLogger(__name__)

AGENT_ENV = "AGL1_AGENT_CLASS"
ISOLATION_ENV = "AGL1_ISOLATION"
_STDERR_TAIL = 2000
_PR_SET_PDEATHSIG = 1

# The child process: load the class named on its command line, run it, exit 0 or 1 (AL's local runner).
_CHILD = """
import asyncio, importlib, inspect, sys, traceback
try:
    spec = sys.argv[1]
    module_name, _, class_name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    result = getattr(importlib.import_module(module_name), class_name)().run()
    if inspect.isawaitable(result):
        asyncio.run(result)
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"""


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, SIGKILL it when the worker dies (even by SIGKILL), so no agent
    outlives the worker that ran it; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Agl1AgentError(RollqError):
    """An AL 1.0 rollout that cannot run as configured, or whose agent failed."""


def _normal(name: str) -> str:
    return name.replace(":", ".")


def _same_class(wanted: str, configured: str) -> bool:
    a, b = _normal(wanted), _normal(configured)
    return a == b or a.endswith("." + b) or b.endswith("." + a)


def env_from_map(task_input: Any, env_map: dict[str, str]) -> dict[str, str]:
    """AL's ``env_map``: each name gets the input value at its path (``input``, ``input.a.0``), JSON unless a
    string; a value that is not such a path is used as it is."""
    env: dict[str, str] = {}
    for name, path in env_map.items():
        if path == "input":
            value: Any = task_input
        elif not path.startswith("input."):
            value = path
        else:
            value = task_input
            for part in path.split(".")[1:]:
                if isinstance(value, dict) and part in value:
                    value = value[part]
                elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                    value = value[int(part)]
                else:
                    raise Agl1AgentError(f"local.env_map path not found: {path}")
        env[name] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return env


# -- the endpoint agents talk to ------------------------------------------------------------------------------


@dataclass
class _Rollout:
    """What the endpoint knows of one running rollout."""

    rollout_id: str
    mode: str
    settings: ProxySettings
    llm: LLM | None
    upstream: str
    """The model server's own endpoint (``llm`` points at the capture proxy in front of it)."""
    version: int
    control: tuple[redis.Redis, Agl1Keys] | None
    events: list[dict[str, Any]] = field(default_factory=list)


class AgentEndpoint:
    """One aiohttp server per worker process on 127.0.0.1, on a thread of its own (as the capture proxy).

    ``/<token>/openai/v1/<chat/completions|completions>`` and ``/<token>/events``, where ``<token>``
    is an unguessable per-rollout secret, revoked when the rollout ends.
    """

    def __init__(self) -> None:
        self.port = 0
        self._rollouts: dict[str, _Rollout] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> AgentEndpoint:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        ready = threading.Event()

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._open(sock))
            ready.set()
            loop.run_forever()

        threading.Thread(target=serve, name="rollq-agl1-endpoint", daemon=True).start()
        ready.wait()
        return self

    async def _open(self, sock: socket.socket) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/{token}/openai/v1/{path:.*}", self._llm)
        app.router.add_post("/{token}/events", self._event)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()

    def open(self, rollout: _Rollout) -> str:
        token = secrets.token_urlsafe(24)
        self._rollouts[token] = rollout
        return token

    def close(self, token: str) -> _Rollout | None:
        return self._rollouts.pop(token, None)

    def base(self, token: str) -> str:
        return f"http://127.0.0.1:{self.port}/{token}"

    @staticmethod
    def _error(status: int, detail: str) -> web.Response:
        return web.json_response({"detail": detail}, status=status)

    async def _event(self, request: web.Request) -> web.Response:
        rollout = self._rollouts.get(request.match_info["token"])
        if rollout is None:
            return self._error(404, "unknown or expired rollout address")
        try:
            payload = await request.json()
            event_type = payload["event_type"]
            data = payload.get("data") or {}
            if not isinstance(event_type, str) or not isinstance(data, dict):
                raise ValueError("event_type must be a string and data an object")
        except (ValueError, KeyError, TypeError) as exc:
            return self._error(422, f"not an EventCreate: {exc}")
        event = {"event_type": event_type, "timestamp": time.time(), "data": data}
        rollout.events.append(event)
        # AL answers with the stored Event; the attempt id is only known once the rollout is published.
        return web.json_response({**event, "rollout_id": rollout.rollout_id, "attempt_id": ""}, status=200)

    async def _llm(self, request: web.Request) -> web.Response:
        rollout = self._rollouts.get(request.match_info["token"])
        if rollout is None:
            return self._error(404, "unknown or expired rollout address")
        path = request.match_info["path"]
        if path not in PROXY_PATHS:
            return self._error(404, f"Unsupported upstream path: {path}")
        try:
            payload = json.loads(await request.read() or b"{}")
        except ValueError:
            return self._error(400, "Invalid JSON in request body")
        if not isinstance(payload, dict):
            return self._error(400, "Request body must be a JSON object")
        if rollout.llm is None:
            return self._error(503, f"No servers available for model '{rollout.settings.model_name}'")
        prepared = rollout.settings.prepare(payload, rollout.mode)
        token = None
        if rollout.control is not None:
            paused, retry_after, reason, token = await asyncio.to_thread(_begin, *rollout.control)
            if paused:
                return web.Response(
                    status=429,
                    headers={"Retry-After": str(retry_after), "X-Agl-Paused": "true"},
                    text=json.dumps({"error": "gateway paused", "reason": reason}),
                    content_type="application/json",
                )
        try:
            if prepared.get("stream", False):
                return self._error(400, "Streaming responses are not supported")
            assert self._session is not None
            started = time.perf_counter()
            try:
                status, answer, retries = await send(
                    self._session, f"{rollout.llm.endpoint.rstrip('/')}/{path}", prepared
                )
            except UpstreamError as exc:
                return self._error(exc.status, exc.detail)
            routes = pop_routed_experts(answer)
            data = model_request_data(
                model=rollout.settings.model_name,
                endpoint=rollout.upstream,
                version=rollout.version,
                request=prepared,
                response=answer,
                started=started,
                http_status=status,
                retry_count=retries,
                routed_experts=routes,
            )
            rollout.events.append({"event_type": "model_request", "timestamp": time.time(), "data": data})
            return web.json_response(answer, status=status)
        finally:
            if token is not None and rollout.control is not None:
                await asyncio.to_thread(_end, *rollout.control, token)


def _begin(connection: redis.Redis, keys: Agl1Keys) -> tuple[bool, int, str | None, str | None]:
    """The pause switch, and (when not paused) this call counted in flight under a fresh token."""
    token = secrets.token_hex(16)
    pipe = connection.pipeline(transaction=True)
    pipe.hgetall(keys.pause)
    pipe.zadd(keys.inflight, {token: time.time() + INFLIGHT_LEASE_SECONDS})
    raw, _ = pipe.execute()
    fields = {k.decode(): v.decode() for k, v in raw.items()}
    if fields.get("paused") == "1":
        connection.zrem(keys.inflight, token)
        return True, int(fields.get("retry_after", "5")), fields.get("reason") or None, None
    return False, 0, None, token


def _end(connection: redis.Redis, keys: Agl1Keys, token: str) -> None:
    connection.zrem(keys.inflight, token)


_endpoint: AgentEndpoint | None = None
_endpoint_lock = threading.Lock()


def endpoint() -> AgentEndpoint:
    """This process's endpoint, started on first use."""
    global _endpoint
    with _endpoint_lock:
        if _endpoint is None:
            _endpoint = AgentEndpoint().start()
        return _endpoint


# -- the LitAgent ---------------------------------------------------------------------------------------------


class Agl1Agent(LitAgent):
    """Runs the AL 1.0 agent classes the worker is configured with (``AGL1_AGENT_CLASS``, or ``agents``).

    ``rollq worker --agent rollq.compat.agl1:Agl1Agent`` with ``AGL1_AGENT_CLASS=calc_agent:Agent``.
    """

    def __init__(
        self,
        agents: Sequence[str | type] | str | None = None,
        *,
        isolation: str | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__()
        spec = agents if agents is not None else os.environ.get(AGENT_ENV, "")
        items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
        if not items:
            raise Agl1AgentError(f"no AL 1.0 agent class configured: set {AGENT_ENV}=module:Class")
        self.classes: dict[str, type] = {}
        for item in items:
            if isinstance(item, type):
                self.classes[f"{item.__module__}.{item.__qualname__}"] = item
                continue
            module, _, name = item.partition(":") if ":" in item else item.rpartition(".")
            loaded = load_object(f"{module}:{name}")  # fails fast at worker start for a wrong name
            self.classes[f"{module}.{name}"] = type(loaded) if not isinstance(loaded, type) else loaded
        self.isolation = (isolation or os.environ.get(ISOLATION_ENV, "process")).strip()
        if self.isolation not in ("process", "inline"):
            raise Agl1AgentError(f"{ISOLATION_ENV} must be 'process' or 'inline', not {self.isolation!r}")
        self.key = key if key is not None else os.environ.get("AGL_KEY", "")
        self._inline_lock: asyncio.Lock | None = None

    # The mode decides the proxy's sampling; both entry points run the same way.
    async def training_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        return await self._run(task_input, rollout_id, resources, "train")

    async def validation_rollout_async(self, task_input: Any, rollout_id: str, resources: NamedResources) -> Any:
        return await self._run(task_input, rollout_id, resources, "val")

    def _pick_class(self, wanted: str | None) -> str:
        if not wanted:
            if len(self.classes) == 1:
                return next(iter(self.classes))
            raise Agl1AgentError(
                f"the rollout names no config.local.agent_class and this worker runs several: {sorted(self.classes)}"
            )
        matches = [name for name in self.classes if _same_class(wanted, name)]
        if len(matches) != 1:
            raise Agl1AgentError(
                f"the rollout asks for agent class {wanted!r}; this worker runs {sorted(self.classes)} "
                f"({AGENT_ENV}) and picks none of any other"
            )
        return matches[0]

    def _control(self) -> tuple[redis.Redis, Agl1Keys] | None:
        try:
            lifecycle = getattr(self.runner, "lifecycle", None)
        except ValueError:  # not run by a worker (a test calling the agent directly): no pause switch
            return None
        keys = getattr(lifecycle, "keys", None)
        connection = getattr(lifecycle, "connection", None)
        if isinstance(keys, Keys) and connection is not None:
            return connection, Agl1Keys(keys)
        return None

    async def _run(self, task_input: Any, rollout_id: str, resources: NamedResources, mode: str) -> Rollout:
        inner = opened(task_input)
        if inner is None:
            raise Agl1AgentError(
                f"task {rollout_id} was not queued through the AL 1.0 API (serve-agl): its input has no 'agl1' key"
            )
        config = inner.get("config") or {}
        local = config.get("local") or {}
        agent = self._pick_class(local.get("agent_class"))
        env = env_from_map(inner.get("input"), dict(local.get("env_map") or {}))
        llms = sorted(
            (name, r) for name, r in resources.items() if isinstance(r, LLM) and name.startswith(RESOURCE_PREFIX)
        )
        llm = llms[sticky_index(rollout_id, len(llms))][1] if llms else None
        proxy = llm.sampling_parameters.get(PROXY_SETTINGS_KEY, {}) if llm is not None else {}
        state = _Rollout(
            rollout_id=rollout_id,
            mode=mode,
            settings=ProxySettings.from_json(proxy),
            llm=llm,
            upstream=str(proxy.get("endpoint", "")),
            version=int(proxy.get("version", 0)),
            control=self._control(),
        )
        where = endpoint()
        token = where.open(state)
        env.update(
            {
                # Agents send it as a bearer key, so never empty: the worker's AGL_KEY, else the rollout's token.
                "AGL_KEY": self.key or token,
                "AGL_OPENAI_BASE_URL": f"{where.base(token)}/openai/v1",
                "AGL_EVENT_URL": f"{where.base(token)}/events",
            }
        )
        try:
            if self.isolation == "process":
                await self._run_child(agent, env, rollout_id)
            else:
                await self._run_inline(self.classes[agent], env)
        finally:
            where.close(token)
        rewards = [e for e in state.events if e["event_type"] == "reward"]
        value = rewards[-1]["data"].get("value") if rewards else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            emit_reward(float(value))  # after the last call's span: it lands on the last triplet
        return Rollout(rollout_id=rollout_id, metadata={EVENTS_METADATA_KEY: state.events})

    async def _run_child(self, agent: str, env: dict[str, str], rollout_id: str) -> None:
        path = os.pathsep.join([p or os.getcwd() for p in sys.path] + [os.environ.get("PYTHONPATH", "")])
        child_env = {**os.environ, "PYTHONPATH": path, **env}
        module, _, name = agent.rpartition(".")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            f"{module}:{name}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=None,
            stderr=asyncio.subprocess.PIPE,
            env=child_env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        try:
            _, stderr = await proc.communicate()
        except BaseException:  # cancelled (timeout, hand-back): the child and what it started go too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), timeout=5)
            raise
        if stderr:
            sys.stderr.write(stderr.decode(errors="replace"))
        if proc.returncode != 0:
            tail = stderr.decode(errors="replace")[-_STDERR_TAIL:].strip()
            last = tail.splitlines()[-1] if tail else "no output"  # the exception, when it is a traceback
            raise Agl1AgentError(f"agent {agent} exited with code {proc.returncode} on {rollout_id}: {last}\n{tail}")

    async def _run_inline(self, cls: type, env: dict[str, str]) -> None:
        if self._inline_lock is None:
            self._inline_lock = asyncio.Lock()
        async with self._inline_lock:
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            try:
                result = cls().run()
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    await result
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
