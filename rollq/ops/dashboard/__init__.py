"""``rollq dashboard``: rq-dashboard 0.9.0 plus rollq's own pages and ``/metrics``, in one Flask app.

rollq's RQ jobs are JSON-serialised (never pickle), so the dashboard must decode
them as JSON. Two pages of rq-dashboard 0.9.0 fail with RQ 2.x; :func:`create_app`
patches both at startup (see :func:`_patch_rq_dashboard`), answers its Requeue routes itself, and wraps its job
JSON and job page to say why a job cannot be shown (:func:`_job_json_or_why`). rollq's pages
(rollouts, one rollout, workers, charts) live under ``/rollq/`` (:mod:`.views`).
It runs under waitress, a production WSGI server. With a token (:mod:`rollq.ops.access`) every page, the
JSON and ``/metrics`` need it; without one it serves loopback only. Every value rq-dashboard's pages show is
escaped, and state changes need a POST with the dashboard's CSRF token (:mod:`.guard`); ``?namespace=`` reads
only the namespace the dashboard was started for.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from rollq.models.errors import RollqError
from rollq.store.connection import describe
from rollq.store.keys import DEFAULT_NAMESPACE, Keys, foreign_key
from rollq.store.rq_workers import ListedWorker

from ..access import DASHBOARD_EXPOSES, check_bind, port_in_use, require_token

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

DEFAULT_PORT = 9181


class _DependencyId(str):
    """A job id that also answers ``.decode()``, as rq-dashboard 0.9.0 expects of dependency ids (RQ 1.x gave bytes)."""

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return str(self)


class _DashboardJob(Job):
    # RQ 2.x returns dependency ids as str; rq-dashboard's job view calls .decode()
    # on each, so the page of any job with dependencies was a 500.
    @property
    def dependency_ids(self) -> list[str]:
        return [_DependencyId(job_id) for job_id in super().dependency_ids]


class _DashboardWorker(ListedWorker):
    """``Worker.all`` as rq-dashboard calls it, reading workers with the dashboard's serializer.

    rq-dashboard 0.9.0 lists workers with ``Worker.all(connection=...)``, so each
    worker object gets RQ's default (pickle) serializer; ``get_current_job()``
    then fetches the busy worker's JSON job with pickle and ``get_call_string()``
    fails with ``DeserializationError``: the workers view was a 500 whenever a
    rollq worker was busy.
    """

    @classmethod
    def all(
        cls,
        connection: Any = None,
        job_class: Any = None,
        queue_class: Any = None,
        queue: Any = None,
        serializer: Any = None,
    ) -> list[Any]:
        from rq_dashboard.web import config

        return super().all(
            connection=connection,
            job_class=job_class or _DashboardJob,
            queue_class=queue_class,
            queue=queue,
            serializer=serializer or config.serializer,
        )

    def get_current_job(self) -> Job | None:
        # The worker hash and the job hash are read one after the other; a job that
        # finished in between (and whose hash RQ deleted) means "no current job", not a 500.
        try:
            return super().get_current_job()
        except NoSuchJobError:
            return None


class _DashboardQueue(Queue):
    """``Queue.all`` as rq-dashboard calls it, without the queues whose key holds another type than RQ's list.

    rq-dashboard lists every queue of the database (``rq:queues``) and counts each with ``LLEN``: one queue key that
    something other than RQ wrote (a string, say) made its queue list and front page a 500, for every namespace. Such
    a queue is left out, and named in the log once per process.
    """

    _named: ClassVar[set[str]] = set()

    @classmethod
    def all(
        cls, connection: Any, job_class: Any = None, serializer: Any = None, death_penalty_class: Any = None
    ) -> Any:
        queues = super().all(
            connection, job_class=job_class, serializer=serializer, death_penalty_class=death_penalty_class
        )
        pipe = connection.pipeline(transaction=False)
        for queue in queues:
            pipe.type(queue.key)
        kept = []
        for queue, kind in zip(queues, pipe.execute(), strict=True):
            name = kind.decode() if isinstance(kind, bytes) else str(kind)
            if name in ("list", "none"):
                kept.append(queue)
            elif queue.key not in cls._named:
                cls._named.add(queue.key)
                log.error("rq-dashboard's queue list leaves out %s", foreign_key("RQ queue", queue.key, name, "list"))
        return kept


def _the_dashboards_connection(url: str, **_options: Any) -> tuple[None, Any]:
    """rq-dashboard's ``from_url`` (``redis_sentinel_url.connect``), which it calls at start and again before every
    ``/<instance>/...`` request: the dashboard's own connection, whose replies time out within seconds.

    rq-dashboard's client had redis-py's default socket timeout (none before redis-py 8), so that its pages and JSON
    hung as long as a browser waited on a stalled Redis; it was also a new client, and a new TCP connection, for each
    request. Now rq-dashboard, rollq's pages and ``/metrics`` share one pool
    (:func:`rollq.ops.metrics.scrape_connection`), and a stalled Redis is a 503 naming it on each."""
    from flask import current_app

    if url != current_app.config["ROLLQ_REDIS_URL"]:  # rollq configures rq-dashboard with one URL, its own
        raise RollqError(f"rq-dashboard asked for a Redis this dashboard was not started for: {describe(url)}")
    return None, current_app.config["ROLLQ_CONNECTION"]


class _RedisDownIsNotCaughtHere(Exception):
    """What rq-dashboard's front page catches instead of ``redis.ConnectionError``: nothing raises it.

    rq-dashboard's queues page (``/``, ``/<n>/view/queues``) caught ``ConnectionError`` (``except
    RedisConnectionError``, a name of its module) and answered 200 with a page saying only "Connection Error", so a
    load balancer's check of ``/`` saw a Redis that refused connections as healthy. The error now reaches the app's
    handler, as on rq-dashboard's other routes: a 503 with one line naming Redis
    (:func:`rollq.ops.dashboard.views.redis_unavailable`)."""


def _patch_rq_dashboard() -> None:
    import rq_dashboard.web as web

    web.config.serializer = JSONSerializer
    web.Worker = _DashboardWorker
    web.Job = _DashboardJob
    web.Queue = _DashboardQueue
    web.from_url = _the_dashboards_connection
    web.RedisConnectionError = _RedisDownIsNotCaughtHere


def _requeue_through_rollq(app: Flask) -> None:
    """rq-dashboard's two Requeue routes, answered by :mod:`.requeue` (rollq jobs re-run, or a clear refusal)."""
    from flask import current_app, jsonify

    from .requeue import requeue, requeue_failed

    def requeue_job_view(job_id: str) -> Any:
        return jsonify(requeue(current_app.redis_conn, job_id))  # type: ignore[attr-defined]

    def requeue_all(queue_name: str) -> Any:
        return jsonify(requeue_failed(current_app.redis_conn, queue_name))  # type: ignore[attr-defined]

    for endpoint, view in (("requeue_job_view", requeue_job_view), ("requeue_all", requeue_all)):
        app.view_functions[rq_dashboard_endpoint(app, endpoint)] = view


def rq_dashboard_endpoint(app: Flask, endpoint: str) -> str:
    """The full name of rq-dashboard's view ``endpoint`` (under its blueprint), which rollq answers for or wraps;
    a :class:`RollqError` when a new rq-dashboard has none, or several, so that rollq's fix is not silently lost."""
    names = [name for name in app.view_functions if name.split(".")[-1] == endpoint]
    if len(names) != 1:
        raise RollqError(f"rq-dashboard has no single {endpoint} route to answer for rollq jobs: {names}")
    return names[0]


def unreadable_job(job_id: str, exc: Exception, quarantine: str, quarantined: bool) -> str:
    """Why rq-dashboard cannot show job ``job_id``: RQ raised ``exc`` reading its hash."""
    where = f"; rollq set it aside in its quarantine list {quarantine}" if quarantined else ""
    return f"job {job_id} cannot be read by RQ ({type(exc).__name__}: {exc}): its hash is not what RQ writes{where}"


def _job_json_or_why(app: Flask, namespace: str) -> None:
    """rq-dashboard's job JSON (``/<n>/data/job/<id>.json``) and job page (``/<n>/view/job/<id>``), each fetching the
    job with RQ first, with an answer naming why where they had a 500: a 422 for a job RQ cannot read (a malformed
    hash, as those rollq quarantines: ``RolloutWorker._quarantine``), a 404 for one that does not exist; JSON for the
    JSON, an escaped page for the page. A Redis that cannot be reached is still a server error."""
    from flask import jsonify
    from markupsafe import escape

    def as_json(job_id: str, error: str, status: int) -> Any:
        return jsonify(id=job_id, error=error), status

    def as_page(job_id: str, error: str, status: int) -> Any:
        # The job id is the caller's (the URL's): escaped like every value rq-dashboard's pages show.
        return str(escape(error)), status

    quarantine = Keys(namespace).quarantine
    for endpoint, answer in (("job_info", as_json), ("job_view", as_page)):
        name = rq_dashboard_endpoint(app, endpoint)
        app.view_functions[name] = _why_not_shown(app.view_functions[name], quarantine, answer)


def _why_not_shown(shown: Any, quarantine: str, answer: Any) -> Any:
    """rq-dashboard's job view ``shown`` with ``answer(job_id, error, status)`` where RQ cannot fetch the job."""
    import redis
    from flask import current_app

    def view(instance_number: int, job_id: str) -> Any:
        try:
            return shown(instance_number=instance_number, job_id=job_id)
        except NoSuchJobError:
            return answer(job_id, f"there is no job {job_id} (it ended and expired, or never existed)", 404)
        except (redis.ConnectionError, redis.TimeoutError):
            raise
        except Exception as exc:  # whatever RQ raises on a hash it did not write (ValueError, DeserializationError...)
            connection = current_app.redis_conn  # type: ignore[attr-defined]
            quarantined = connection.lpos(quarantine, job_id) is not None
            return answer(job_id, unreadable_job(job_id, exc, quarantine, quarantined), 422)

    return view


def _no_such_instance(app: Flask) -> None:
    """An rq-dashboard instance number that does not exist (``/1/...`` on a dashboard of one Redis): a 404 naming
    the instances that do (URLs with passwords masked), JSON for its ``.json`` views, where rq-dashboard's
    ``push_rq_connection`` raised ``LookupError`` and the answer was a 500. Runs before it (an app's
    ``before_request`` runs before its blueprints')."""
    from flask import Response, jsonify, request

    @app.before_request
    def _refuse_unknown_instance() -> Any:
        number = (request.view_args or {}).get("instance_number")
        urls = app.config["RQ_DASHBOARD_REDIS_URL"]  # a tuple once setup_rq_connection ran
        if request.blueprint != "rq_dashboard" or number is None or number < len(urls):
            return None
        have = ", ".join(f"{i} ({describe(url)})" for i, url in enumerate(urls))
        line = f"there is no rq-dashboard instance {number}; this dashboard has instance{'s' * (len(urls) > 1)} {have}"
        if request.path.endswith(".json"):
            return jsonify(error=line), 404
        return Response(line + "\n", status=404, mimetype="text/plain")


def create_app(redis_url: str, namespace: str = DEFAULT_NAMESPACE) -> Flask:
    """rq-dashboard's Flask app on ``redis_url`` (redis://, rediss://, unix://), patched, with rollq's pages added."""
    try:
        from rq_dashboard.cli import make_flask_app
        from rq_dashboard.web import setup_rq_connection
    except ImportError as exc:  # rq-dashboard itself, or six/arrow/flask it imports
        missing = (exc.name or "rq_dashboard").split(".")[0]
        raise RollqError(
            f"the dashboard needs rq-dashboard and its imports ({missing} is missing): pip install 'rollq[dashboard]'"
        ) from exc
    if urlsplit(redis_url).scheme == "memory":
        raise RollqError(
            "the dashboard needs a Redis server; memory:// exists only inside one process: pass --url redis://..."
        )
    from ..metrics import scrape_connection
    from .guard import install_guard
    from .views import install

    _patch_rq_dashboard()
    app = make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = redis_url
    # Delete and Empty remove RQ jobs only, leaving their tasks queued with no job (a reaper queues them again,
    # but only after its sweep reaches them): off, as rollq requeues and fails tasks itself.
    app.config["RQ_DASHBOARD_DISABLE_DELETE"] = True
    # Replies within a few seconds: a stalled Redis is a 503 on /metrics, the polled JSON and rq-dashboard's pages,
    # not a hung scrape or page. rq-dashboard gets the same connection (_the_dashboards_connection).
    install(app, scrape_connection(redis_url), namespace)
    app.config["ROLLQ_REDIS_URL"] = redis_url
    with app.app_context():
        setup_rq_connection(app)
    _requeue_through_rollq(app)
    _job_json_or_why(app, namespace)
    _no_such_instance(app)
    install_guard(app)
    return app


def serve(
    redis_url: str,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    bind: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    threads: int = 8,
    token: str = "",
) -> None:
    """Serve the dashboard on ``bind:port`` with waitress until interrupted; behind ``token`` when given (a
    non-loopback ``bind`` needs one)."""
    check_bind(bind, token, "the dashboard", DASHBOARD_EXPOSES)
    app = create_app(redis_url, namespace)
    try:
        import waitress
    except ImportError as exc:
        raise RollqError("the dashboard runs under waitress: pip install 'rollq[dashboard]'") from exc
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth" warnings under page polling
    try:
        server = waitress.create_server(require_token(app, token), host=bind, port=port, threads=threads)
    except OSError as exc:
        raise port_in_use(exc, bind, port) or exc from None
    print(
        f"rollq dashboard on http://{bind}:{port}/rollq/ (rq-dashboard on /, metrics on /metrics) "
        f"for {describe(redis_url)}, namespace {namespace!r}" + (", token required" if token else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
