"""rollq's own dashboard pages (under ``/rollq/``) and ``/metrics``, beside rq-dashboard in one Flask app.

Pages are rendered on the server from one snapshot per request, so what a
browser (or a test) sees is in the HTML; they refresh themselves every 5 s.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from flask import Blueprint, Flask, Response, abort, current_app, render_template, request
from markupsafe import Markup
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rollq.store.keys import Keys

from ..metrics import registry
from ..status import snapshot
from . import data
from .svg import line_chart

pages = Blueprint("rollq", __name__, url_prefix="/rollq", template_folder="templates")


def _conn() -> redis.Redis:
    return current_app.config["ROLLQ_CONNECTION"]  # type: ignore[no-any-return]


def _keys() -> Keys:
    # Only the namespace the dashboard serves: ?namespace= must not read any other one on the server.
    configured = current_app.config["ROLLQ_NAMESPACE"]
    asked = request.args.get("namespace") or configured
    if asked != configured:
        abort(404, "this dashboard serves one namespace; start it with -n for another")
    return Keys(configured)


def _common() -> dict[str, Any]:
    keys = _keys()
    return {"namespace": keys.namespace, "now": time.strftime("%H:%M:%S UTC", time.gmtime())}


@pages.route("/")
def rollouts() -> str:
    filters = data.Filters(
        status=request.args.get("status", ""),
        mode=request.args.get("mode", ""),
        resources_id=request.args.get("resources_id", ""),
    )
    s = snapshot(_conn(), _keys())
    rows = data.rollout_rows(_conn(), _keys(), filters)
    return render_template("rollq/rollouts.html", rows=rows, filters=filters, s=s, **_common())


@pages.route("/rollout/<rollout_id>")
def rollout(rollout_id: str) -> str:
    page = data.rollout_page(_conn(), _keys(), rollout_id)
    if page is None:
        abort(404, f"no task {rollout_id!r} in namespace {_keys().namespace!r}")
    return render_template("rollq/rollout.html", page=page, **_common())


@pages.route("/workers")
def workers() -> str:
    s = snapshot(_conn(), _keys())
    return render_template("rollq/workers.html", s=s, fmt_time=_ago, **_common())


@pages.route("/charts")
def charts() -> str:
    # Bucket width in seconds (?bucket=N), 1 s to an hour; a minute by default.
    bucket = min(3600, max(1, request.args.get("bucket", 60, type=int) or 60))
    throughput, rewards = data.charts(_conn(), _keys(), bucket_seconds=bucket)
    return render_template(
        "rollq/charts.html",
        throughput=Markup(line_chart([throughput])),
        rewards=Markup(line_chart(rewards)),
        versions=[r.label for r in rewards],
        **_common(),
    )


def _ago(t: float | None) -> str:
    if t is None:
        return "never"
    return f"{max(0.0, time.time() - t):.0f}s ago"


def metrics() -> Response:
    reg = registry(lambda: snapshot(_conn(), _keys()))
    return Response(generate_latest(reg), mimetype=CONTENT_TYPE_LATEST)


def install(app: Flask, connection: redis.Redis, namespace: str) -> None:
    """Add rollq's pages and /metrics to ``app`` (rq-dashboard's), on ``connection`` and ``namespace``."""
    app.config["ROLLQ_CONNECTION"] = connection
    app.config["ROLLQ_NAMESPACE"] = namespace
    app.register_blueprint(pages)
    app.add_url_rule("/metrics", "rollq_metrics", metrics)
