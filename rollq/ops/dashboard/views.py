"""rollq's own dashboard pages (under ``/rollq/``), the JSON they poll (under ``/rollq/api/``) and ``/metrics``,
beside rq-dashboard in one Flask app.

A page is rendered on the server from one read per request, so what a browser (or a test) sees is in the HTML;
then its script polls the page's JSON every few seconds and updates the page in place (no reloads; ``?refresh=0``
turns polling off). Lists and charts read summaries (:mod:`rollq.store.summaries`), never whole rollouts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from flask import Blueprint, Flask, Response, abort, current_app, jsonify, render_template, request, url_for
from markupsafe import Markup, escape
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rollq.models.errors import InvalidTaskError
from rollq.store.keys import Keys

from ..metrics import REDIS_UNAVAILABLE, registry, unavailable
from ..status import Snapshot, group_outcomes, snapshot
from . import data, params
from .params import BadParameter
from .svg import line_chart

pages = Blueprint("rollq", __name__, url_prefix="/rollq", template_folder="templates")
log = logging.getLogger(__name__)


@pages.errorhandler(InvalidTaskError)
@pages.errorhandler(redis.ResponseError)
def _unreadable(exc: Exception) -> tuple[str, int]:
    """A task record that is not rollq's (corrupt, or a key of another type): a page that says so, not a 500."""
    if isinstance(exc, redis.ResponseError) and "WRONGTYPE" not in str(exc):
        raise exc
    rollout_id = (request.view_args or {}).get("rollout_id", "?")
    return str(escape(f"task {rollout_id!r}: its record in Redis is not a valid rollq task: {exc}")), 422


@pages.errorhandler(BadParameter)
def _bad_parameter(exc: BadParameter) -> tuple[Response | str, int]:
    """A query parameter the page cannot use: a 400 naming it (JSON for the JSON the pages poll), not a 500."""
    if request.path.startswith(f"{pages.url_prefix}/api/"):
        return jsonify(error=str(exc), parameter=exc.name), 400
    back = url_for("rollq.rollouts")
    return str(escape(str(exc)) + Markup(f'. <a href="{escape(back)}">newest rollouts</a>')), 400


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


def _filters() -> data.Filters:
    """The rollouts list's filters; ``status`` and ``mode`` must name one that exists (resources and group ids are
    free text: one that matches nothing shows an empty list)."""
    args = request.args
    return data.Filters(
        status=params.one_of("status", args.get("status"), params.STATUSES),
        mode=params.one_of("mode", args.get("mode"), params.MODES),
        resources_id=args.get("resources_id", ""),
        group=args.get("group", ""),
    )


def _before() -> str | None:
    """The page cursor ``?before=``: a stream id as the "older" link carries, checked before it reaches Redis."""
    return params.stream_cursor("before", request.args.get("before"))


def _cards(s: Snapshot) -> dict[str, int]:
    """The rollouts page's cards, keyed by their ``data-role``; one per rollout status, so that they add up to the
    rollouts published, and ``task-missing``: results kept aside because Redis had lost their task record (as
    ``rollq status`` and ``rollq_task_missing`` count them), which no status card counts."""
    return {
        "queued": s.queued,
        "in-flight": s.in_flight,
        **{status.value: n for status, n in s.outcomes.items()},
        "dead-letter": s.dead_letter,
        "task-missing": s.task_missing,
        "workers": s.workers_alive,
    }


@pages.route("/")
def rollouts() -> str:
    filters, before = _filters(), _before()
    s = snapshot(_conn(), _keys())
    listing = data.rollout_rows(_conn(), _keys(), filters, before=before)
    return render_template(
        "rollq/rollouts.html",
        rows=listing.rows,
        listing=listing,
        filters=filters,
        s=s,
        versions=data.sort_versions(s.resource_versions),
        statuses=list(params.STATUSES),
        modes=list(params.MODES),
        **_common(),
    )


@pages.route("/api/rollouts")
def rollouts_json() -> Response:
    listing = data.rollout_rows(_conn(), _keys(), _filters(), before=_before())
    return jsonify(
        rows=[r.to_json() for r in listing.rows],
        before=listing.before,
        scanned=listing.scanned,
        cards=_cards(snapshot(_conn(), _keys())),
        now=_common()["now"],
    )


@pages.route("/rollout/<rollout_id>")
def rollout(rollout_id: str) -> str:
    page = data.rollout_page(_conn(), _keys(), rollout_id)
    if page is None:
        abort(404, f"no task {rollout_id!r} in namespace {_keys().namespace!r}")
    return render_template("rollq/rollout.html", page=page, **_common())


@pages.route("/api/rollout/<rollout_id>")
def rollout_json(rollout_id: str) -> Response:
    """The task's state and attempts only (a few hundred bytes): the page reloads itself once when it ends."""
    from rollq.store.queries import read_attempts
    from rollq.store.records import read_records

    record = read_records(_conn(), _keys(), [rollout_id]).get(rollout_id)
    if record is None:
        abort(404)
    return jsonify(
        state=record.state.value,
        attempts=[a.attempt for a in read_attempts(_conn(), _keys(), rollout_id)],
        now=_common()["now"],
    )


def _workers_json(s: Snapshot) -> dict[str, Any]:
    return {
        "alive": s.workers_alive,
        "dead": len(s.workers) - s.workers_alive,
        "in_flight": s.in_flight,
        "stale": s.stale_attempts,
        "workers": [
            {
                "name": w["name"],
                "state": w["state"] if w["alive"] else "dead",
                "in_flight": w["in_flight"],
                "concurrency": w["concurrency"] or "-",
                "last_heartbeat": _ago(w["last_heartbeat"]),
            }
            for w in s.workers
        ],
    }


@pages.route("/workers")
def workers() -> str:
    s = snapshot(_conn(), _keys())
    return render_template("rollq/workers.html", s=s, w=_workers_json(s), **_common())


@pages.route("/api/workers")
def workers_json() -> Response:
    return jsonify(**_workers_json(snapshot(_conn(), _keys())), now=_common()["now"])


def _charts() -> dict[str, Any]:
    # Bucket width in seconds (?bucket=N), 1 s to an hour; a minute by default.
    bucket = params.int_in("bucket", request.args.get("bucket"), 1, 3600, 60)
    through = data.throughput(_conn(), _keys(), bucket_seconds=bucket)
    stats = data.read_stats(_conn(), _keys())
    rewards = data.reward_by_version(stats)
    return {
        "throughput": line_chart([through]),
        "reward": line_chart(rewards.series, x_labels=rewards.versions),
        "versions": rewards.versions,
        # What Producer.batches did with the groups it read (docs/training.md): delivered, stale, failed.
        "training_groups": group_outcomes(stats),
    }


@pages.route("/charts")
def charts() -> str:
    c = _charts()
    return render_template(
        "rollq/charts.html",
        throughput=Markup(c["throughput"]),
        rewards=Markup(c["reward"]),
        versions=c["versions"],
        training_groups=c["training_groups"],
        **_common(),
    )


@pages.route("/api/charts")
def charts_json() -> Response:
    return jsonify(**_charts(), now=_common()["now"])


def _ago(t: float | None) -> str:
    if t is None:
        return "never"
    return f"{max(0.0, time.time() - t):.0f}s ago"


def metrics() -> Response:
    reg = registry(lambda: snapshot(_conn(), _keys()))
    return Response(generate_latest(reg), mimetype=CONTENT_TYPE_LATEST)


def redis_unavailable(exc: Exception) -> tuple[Response, int]:
    """Redis did not answer a read in time (stalled, down): a 503 with one line, logged, so that a scrape or a
    page's poll fails at once and says why, where it was a 500 with a traceback, after a minute's hang. JSON for the
    JSON pages poll (rollq's under ``/rollq/api/``, rq-dashboard's ``.json``), one line of text for the rest."""
    line = unavailable(exc)
    log.warning("answered 503 to %s: %s", request.path, line)
    if request.path.startswith(f"{pages.url_prefix}/api/") or request.path.endswith(".json"):
        return jsonify(error=line), 503
    return Response(line + "\n", mimetype="text/plain"), 503


def install(app: Flask, connection: redis.Redis, namespace: str) -> None:
    """Add rollq's pages and /metrics to ``app`` (rq-dashboard's), on ``connection`` and ``namespace``."""
    app.config["ROLLQ_CONNECTION"] = connection
    app.config["ROLLQ_NAMESPACE"] = namespace
    for error in REDIS_UNAVAILABLE:  # app-wide: /metrics is not under the blueprint
        app.register_error_handler(error, redis_unavailable)
    app.jinja_env.filters["utc"] = lambda t: time.strftime("%H:%M:%S", time.gmtime(t)) if t else "-"
    app.register_blueprint(pages)
    app.add_url_rule("/metrics", "rollq_metrics", metrics)
