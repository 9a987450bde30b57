"""``rollq serve-agl``: Agent Lightning 1.0's server API on rollq, for AL 1.0's trainer and clients."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import click
from pydantic import ValidationError

from rollq.models.click_types import FiniteFloat, Seconds
from rollq.models.policy import MAX_POLICY_SECONDS, RolloutPolicy
from rollq.store.connection import connect

from ..binding import refusal
from ..gateway_options import client_limits


@click.command("serve-agl")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (not loopback: needs --key).")
@click.option(
    "--port", "-p", default=8080, show_default=True, type=click.IntRange(min=0, max=65535), help="Port to listen on."
)
@click.option(
    "--key",
    envvar=["ROLLQ_AGL_KEY", "AGL_KEY"],
    default="",
    help="Bearer key every route but /healthz requires [env: ROLLQ_AGL_KEY, AGL_KEY]; empty: none.",
)
@click.option(
    "--model-name", default="Qwen/Qwen2.5-7B-Instruct", show_default=True, help="AL's default_proxy.model_name."
)
@click.option("--train-temperature", default=1.0, show_default=True, type=FiniteFloat(min=0))
@click.option("--val-temperature", default=0.7, show_default=True, type=FiniteFloat(min=0))
@click.option("--log-probs/--no-log-probs", default=True, show_default=True, help="Ask for logprobs in train mode.")
@click.option("--routed-experts/--no-routed-experts", default=False, show_default=True)
@click.option("--max-attempts", default=3, show_default=True, type=click.IntRange(min=1), help="Attempts per rollout.")
@click.option(
    "--retry-on",
    default="timeout,unresponsive",
    show_default=True,
    help="Failures that get another attempt: any of exception,timeout,unresponsive (comma-separated).",
)
@click.option(
    "--unresponsive-seconds",
    default=30.0,
    show_default=True,
    type=Seconds(0, MAX_POLICY_SECONDS, min_open=True),
    help="A worker silent this long loses its attempt to a retry.",
)
@click.option(
    "--lease",
    "lease_seconds",
    default=300.0,
    show_default=True,
    type=Seconds(1.0, MAX_POLICY_SECONDS),
    help="Seconds an attempt a runner claimed (PATCH running) is held without a sign of life (an accepted write, "
    "or a listing by its claimant); then it is handed back. Never past the rollout's timeout + 60 s.",
)
@client_limits(unfinished="Unfinished", past_the_limit="its claims get 429", what="rollout")
@click.pass_context
def serve_agl(
    ctx: click.Context,
    host: str,
    port: int,
    key: str,
    model_name: str,
    train_temperature: float,
    val_temperature: float,
    log_probs: bool,
    routed_experts: bool,
    max_attempts: int,
    retry_on: str,
    unresponsive_seconds: float,
    lease_seconds: float,
    max_held_per_client: int,
    max_releases: int,
    max_body_bytes: int | None,
) -> None:
    """Serve Agent Lightning 1.0's server API (agl-server's routes) from this namespace.

    AL 1.0's AglRolloutManager and clients point at http://HOST:PORT/ unchanged; rollouts are rollq
    tasks, run by `rollq worker --agent rollq.compat.agl1:Agl1Agent` with AGL1_AGENT_CLASS=module:Class,
    so they survive restarts, are retried with attempts and bounded by config.timeout_seconds.

    Without --key it serves loopback only. A runner (AL's agl-controller) gets each queued rollout listed as
    <rollout_id>.<token>; its PATCHes, events and LLM calls need that token (403 otherwise).
    """
    from rollq.producer.producer import Producer

    from .app import Server
    from .runners import LeaseSettings
    from .store import Agl1Store
    from .upstream import ProxySettings

    refused = refusal(host, key, "pass --key (or set ROLLQ_AGL_KEY)")
    if refused:
        raise click.UsageError(refused)
    kinds = frozenset(k.strip() for k in retry_on.split(",") if k.strip())
    root = ctx.find_root().params
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        policy = RolloutPolicy(max_attempts=max_attempts, retry_on=kinds, unresponsive_seconds=unresponsive_seconds)  # type: ignore[arg-type]
    except ValidationError as exc:
        message = f"{retry_on!r}: use exception, timeout, unresponsive ({exc.error_count()} error(s))"
        raise click.BadParameter(message, param_hint="--retry-on") from None
    producer = Producer(connect(root["url"]), root["namespace"], policy=policy)
    settings = ProxySettings(
        model_name=model_name,
        include_log_probs=log_probs,
        include_routed_experts=routed_experts,
        train_temperature=train_temperature,
        val_temperature=val_temperature,
    )
    leases = LeaseSettings(lease_seconds, max_held_per_client, max_releases)
    server = Server(Agl1Store(producer, settings, leases), host, port, key, max_body_bytes=max_body_bytes)

    async def run() -> None:
        await server.start()
        click.echo(f"rollq serve-agl: http://{host}:{port}/ -> namespace {root['namespace']!r}", err=True)
        try:
            await asyncio.Event().wait()
        finally:
            await server.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
