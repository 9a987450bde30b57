"""``rollq dashboard``: rq-dashboard on a Redis holding real rollq jobs, checked in headless Chromium."""

from __future__ import annotations

import os
import shutil
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import Worker

from rollq.models.errors import RollqError
from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from rollq.store.keys import Keys
from tests.support.browser import chromium, rendered_rows, require_chromium
from tests.support.dashboard import SCREENSHOTS, Dashboard
from tests.support.http_json import get_json
from tests.support.servers import RedisServer, WorkerProcess
from tests.support.waiting import wait_until

# The workers view shows all three at once: the busy worker, its rollq job and the namespace's queue.
SCREENSHOT_PAGES = {
    "dashboard.png": "/0/view/workers",
    "dashboard-queues.png": "/",
    "dashboard-jobs.png": "/0/view/jobs/{namespace}/finished/8/asc/1",
}
PASSWORD = "dashboard-test-secret"


@pytest.mark.redis
@pytest.mark.browser
@pytest.mark.slow
def test_browser_shows_the_rollq_queue_a_finished_job_and_a_busy_worker(
    own_redis: Callable[..., RedisServer],
    workers: Callable[..., WorkerProcess],
    dashboard: Callable[[str], Dashboard],
    tmp_path: Path,
) -> None:
    browser = require_chromium()
    server = own_redis(password=PASSWORD)
    namespace = "rollq"  # the default namespace, on a server of the test's own
    producer = Producer.from_url(server.url, namespace)
    client = server.client()
    worker = workers(
        server.url,
        namespace,
        env={
            "ROLLQ_AGENT": "tests.support.dashboard_agents:HoldingAgent",
            "ROLLQ_CONCURRENCY": "2",
            "ROLLQ_GRACE_SECONDS": "0",
        },
    )

    finished = [task.rollout_id for task in producer.enqueue_many([{"n": 1}, {"n": 2}], mode="train")]
    registry = FinishedJobRegistry(namespace, connection=client)
    finished_jobs = {producer.keys.job_id(rid) for rid in finished}
    wait_until(
        lambda: finished_jobs <= set(registry.get_job_ids(cleanup=False)), "RQ to record the finished jobs", timeout=60
    )
    for rollout_id in finished:
        # RQ drops a finished rollq job after 60 s; a slow machine must not lose it before the browser looks.
        client.persist(Job.key_for(producer.keys.job_id(rollout_id)))
    # Queued only after the others are done, so no finishing job clears the worker's current job.
    held = producer.enqueue({"hold": True}, mode="train").rollout_id

    def busy_with_held() -> bool:
        assert worker.process.poll() is None, f"worker exited: {worker.log()}"
        listed = Worker.all(connection=client, serializer=JSONSerializer)
        return any(w.get_current_job_id() == producer.keys.job_id(held) for w in listed)

    wait_until(busy_with_held, "the worker to run the held rollout", timeout=60)
    (rq_worker,) = Worker.all(connection=client, serializer=JSONSerializer)

    dash = dashboard(server.url)
    base = dash.base

    # The endpoint that was a 500 in rq-dashboard 0.9.0 while a worker was busy with a JSON job.
    (listed,) = get_json(f"{base}/0/data/workers.json")["workers"]
    assert listed["state"] == "busy" and listed["current_job"]["job_id"] == producer.keys.job_id(held)

    queue_rows = rendered_rows(chromium(browser, tmp_path / "profile", base + "/"), "queue")
    (row,) = [r for r in queue_rows if r[0] == namespace]
    # Columns: name, queued, deferred, scheduled, started, finished, failed, canceled.
    assert int(row[4]) == 1 and int(row[5]) == len(finished), row

    jobs_dom = chromium(browser, tmp_path / "profile", f"{base}/0/view/jobs/{namespace}/finished/8/asc/1")
    job_text = " ".join(" ".join(r) for r in rendered_rows(jobs_dom, "job"))
    assert all(rollout_id in job_text for rollout_id in finished), job_text

    worker_rows = rendered_rows(chromium(browser, tmp_path / "profile", f"{base}/0/view/workers"), "worker")
    (cells,) = worker_rows
    assert cells[0] == rq_worker.name and held in cells[1] and cells[2] == namespace, cells

    # The screenshots land in the test's temporary directory; ROLLQ_UPDATE_SCREENSHOTS=1
    # also refreshes the copies the docs show.
    for name, path in SCREENSHOT_PAGES.items():
        shot = tmp_path / name
        chromium(browser, tmp_path / "profile", base + path.format(namespace=namespace), screenshot=shot)
        assert shot.read_bytes().startswith(b"\x89PNG")
        print(f"screenshot: {shot}")
        if os.environ.get("ROLLQ_UPDATE_SCREENSHOTS"):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, SCREENSHOTS / name)

    dash.stop()
    assert PASSWORD not in dash.log()


@pytest.mark.redis
def test_job_page_of_a_job_with_dependencies_loads(redis_server: RedisServer, namespace: str) -> None:
    client = redis_server.client()
    queue = Queue(namespace, connection=client, serializer=JSONSerializer)
    parent = queue.enqueue("os.getcwd")
    child = queue.enqueue("os.getcwd", depends_on=parent)
    app = create_app(redis_server.url)

    response = app.test_client().get(f"/0/data/job/{child.id}.json")

    assert response.status_code == 200, response.text
    assert response.json["depends_on"] == [parent.id]


def test_dashboard_refuses_an_in_process_memory_url() -> None:
    with pytest.raises(RollqError, match="needs a Redis server"):
        create_app("memory://")


def test_dashboard_without_rq_dashboard_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rq_dashboard.cli", None)  # makes the import fail

    with pytest.raises(RollqError, match=r"pip install 'rollq\[dashboard\]'"):
        create_app("redis://127.0.0.1:1/0")


class _Hits:
    """A loopback HTTP listener that records every path requested: what a script injected into a page would call."""

    def __init__(self) -> None:
        import http.server
        import threading

        hits = self.paths = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.redis
@pytest.mark.browser
def test_script_in_task_input_errors_and_metadata_runs_on_no_dashboard_page(
    own_redis: Callable[..., RedisServer],
    workers: Callable[..., WorkerProcess],
    dashboard: Callable[[str], Dashboard],
    tmp_path: Path,
) -> None:
    # On 48fc877 rq-dashboard's job page ran script taken from a task input quoted in an agent's error.
    browser = require_chromium()
    hits = _Hits()
    payload = (
        f"<img src=x onerror=\"fetch('http://127.0.0.1:{hits.port}/onerror')\">"
        f"<script>fetch('http://127.0.0.1:{hits.port}/script')</script>"
        f"<svg onload=\"fetch('http://127.0.0.1:{hits.port}/svg')\"></svg>"
    )
    server = own_redis()
    namespace = "rollq"
    producer = Producer.from_url(server.url, namespace)
    workers(server.url, namespace, env={"ROLLQ_AGENT": "tests.support.hostile_agents:HostileAgent"})
    (task,) = producer.enqueue_many([{"raise": payload}], metadata={"note": payload}, mode="train")
    (rollout,) = producer.wait([task.rollout_id], timeout=30)
    assert payload in rollout.metadata["error"]["message"]
    client = server.client()
    client.persist(Job.key_for(producer.keys.job_id(task.rollout_id)))

    base = dashboard(server.url).base
    # The pages that show the payload (as text), then the lists that link to it.
    for page in [f"/0/view/job/{producer.keys.job_id(task.rollout_id)}", f"/rollq/rollout/{task.rollout_id}"]:
        dom = chromium(browser, tmp_path / "profile", base + page)
        assert "onerror" in dom, f"{page} did not show the payload at all"
    for page in [f"/0/view/jobs/{namespace}/failed/8/asc/1", "/rollq/", "/rollq/?status=failed"]:
        chromium(browser, tmp_path / "profile", base + page)
    assert hits.paths == [], f"injected script ran: {hits.paths}"


@pytest.mark.redis
def test_dashboard_changes_state_only_by_post_with_its_csrf_token_and_reads_only_its_namespace(
    redis_server: RedisServer, namespace: str
) -> None:
    app = create_app(redis_server.url, namespace)
    web = app.test_client()
    page = web.get("/")
    cookie = page.headers.get("Set-Cookie", "")
    assert cookie.startswith("_csrf_token=") and "SameSite=Strict" in cookie
    token = cookie.split(";")[0].split("=", 1)[1]
    assert web.get(f"/requeue/{namespace}").status_code == 405  # a link or an <img> must not requeue
    assert web.post(f"/requeue/{namespace}").status_code == 403
    assert web.post(f"/requeue/{namespace}", headers={"X-CSRFToken": "forged"}).status_code == 403
    assert web.post(f"/requeue/{namespace}", headers={"X-CSRFToken": token}).status_code == 200
    assert web.get("/rollq/").status_code == 200
    assert web.get(f"/rollq/?namespace={namespace}").status_code == 200
    assert web.get("/rollq/?namespace=someone-else").status_code == 404
    assert web.get("/rollq/workers?namespace=someone-else").status_code == 404


@pytest.mark.parametrize("corrupt", ["bad fields", "not a hash"])
def test_a_corrupt_task_record_gets_a_page_that_says_so_not_a_server_error(
    redis_server: RedisServer, namespace: str, corrupt: str
) -> None:
    client = redis_server.client()
    key = Keys(namespace).task("t1")
    if corrupt == "not a hash":
        client.set(key, "junk")
    else:
        client.hset(key, mapping={"task": "{not json", "state": "queued", "claims": "0"})
    app = create_app(redis_server.url, namespace).test_client()
    for path in ("/rollq/rollout/t1", "/rollq/api/rollout/t1"):
        response = app.get(path)
        assert response.status_code == 422, (path, response.status_code)
        assert "t1" in response.get_data(as_text=True)


MALFORMED_JOBS = {
    "bogus-status": {"status": "bogus"},
    "bad-created-at": {"created_at": "yesterday"},
    "bad-dependencies": {"dependency_ids": "{not json"},
    "not-a-hash": {},  # the job's key holds a string
}


def _quarantine_malformed(client: redis.Redis, keys: Keys, job: str) -> dict[str, Any]:
    """Write job ``job`` malformed as :data:`MALFORMED_JOBS` says and quarantine it, as a worker would; the fields
    of a job RQ can read, for comparison."""
    payload = zlib.compress(JSONSerializer.dumps(("rollq.worker.jobs.run_rollout", None, ["nobody"], {})))
    base = {"data": payload, "status": "queued", "origin": keys.queue_name, "created_at": "2026-01-01T00:00:00.000000Z"}
    if job == "not-a-hash":
        client.set(Keys.rq_job(job), "junk")
    else:
        client.hset(Keys.rq_job(job), mapping={**base, **MALFORMED_JOBS[job]})
    client.rpush(keys.quarantine, job)
    return base


@pytest.mark.parametrize("job", sorted(MALFORMED_JOBS))
def test_rq_dashboards_job_json_of_a_malformed_quarantined_job_says_why_not_a_server_error(
    redis_server: RedisServer, namespace: str, job: str
) -> None:
    # An outside audit: rq-dashboard's own /0/data/job/<id>.json answered 500 for the jobs rollq quarantines
    # because RQ cannot read them (rollq.worker.rq_worker's _quarantine): the operator saw no reason.
    client, keys = redis_server.client(), Keys(namespace)
    base = _quarantine_malformed(client, keys, job)
    web = create_app(redis_server.url, namespace).test_client()
    response = web.get(f"/0/data/job/{job}.json")
    assert response.status_code == 422, (response.status_code, response.get_data(as_text=True)[:300])
    assert response.json["id"] == job and "cannot be read by RQ" in response.json["error"], response.json
    assert keys.quarantine in response.json["error"]
    assert web.get("/0/data/job/no-such-job.json").status_code == 404
    # A job RQ can read is rq-dashboard's own answer, as before.
    client.hset(Keys.rq_job("fine"), mapping=base)
    assert web.get("/0/data/job/fine.json").json["status"] == "queued"


@pytest.mark.parametrize(
    ("view", "url"),
    [
        ("job_info", "/<int:instance_number>/data/job/<job_id>.json"),
        ("job_view", "/<int:instance_number>/view/job/<job_id>"),
    ],
)
def test_rollq_wraps_rq_dashboards_job_views_where_rq_dashboard_routes_them(view: str, url: str) -> None:
    # Pins the rq-dashboard internals rollq's wrappers of its job JSON and job page depend on: one view each, at this
    # URL, called with these keywords. A new rq-dashboard that moves one fails here (and create_app raises RollqError).
    import inspect

    from rq_dashboard.cli import make_flask_app

    from rollq.ops.dashboard import rq_dashboard_endpoint

    app = make_flask_app(None, None, None, "")
    name = rq_dashboard_endpoint(app, view)
    [rule] = [r.rule for r in app.url_map.iter_rules() if r.endpoint == name]
    assert rule == url
    assert list(inspect.signature(inspect.unwrap(app.view_functions[name])).parameters) == ["instance_number", "job_id"]


@pytest.mark.parametrize("job", sorted(MALFORMED_JOBS))
def test_rq_dashboards_job_page_of_a_malformed_quarantined_job_says_why_not_a_server_error(
    redis_server: RedisServer, namespace: str, job: str
) -> None:
    # rq-dashboard's HTML job page (/0/view/job/<id>) fetched the job with RQ before rendering: a 500 with no reason
    # for the jobs rollq quarantines, as its job JSON had (96b1b29), and for a job that does not exist.
    client, keys = redis_server.client(), Keys(namespace)
    base = _quarantine_malformed(client, keys, job)
    web = create_app(redis_server.url, namespace).test_client()
    response = web.get(f"/0/view/job/{job}")
    text = response.get_data(as_text=True)
    assert response.status_code == 422, (response.status_code, text[:300])
    assert f"job {job} cannot be read by RQ" in text and keys.quarantine in text, text
    missing = web.get("/0/view/job/no-such-job")
    assert missing.status_code == 404 and "there is no job no-such-job" in missing.get_data(as_text=True)
    foreign = web.get("/0/view/job/<b>x")  # an id RQ refuses: the caller's words are escaped
    assert foreign.status_code == 422 and "&lt;b&gt;x" in foreign.get_data(as_text=True)
    # A job RQ can read gets rq-dashboard's own page, as before.
    client.hset(Keys.rq_job("fine"), mapping=base)
    assert web.get("/0/view/job/fine").status_code == 200


def test_rq_dashboards_queue_list_leaves_out_a_queue_key_of_another_type_and_shows_the_others(
    redis_server: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # CI: one RQ queue key holding a string (something other than RQ wrote it), listed in the database's rq:queues,
    # made rq-dashboard's queue list (/0/data/queues.json, and its front page) a 500 for every namespace: LLEN
    # raised WRONGTYPE while counting it.
    client = redis_server.client()
    damaged = Keys(f"{namespace}-damaged")
    Producer.from_url(redis_server.url, namespace).enqueue({"q": 1})
    client.set(damaged.rq_queue, "junk")
    client.sadd("rq:queues", damaged.rq_queue)
    try:
        web = create_app(redis_server.url, namespace).test_client()
        response = web.get("/0/data/queues.json")
        assert response.status_code == 200, response.get_data(as_text=True)[:300]
        names = {q["name"] for q in response.json["queues"]}
        assert namespace in names and damaged.queue_name not in names
        assert f"the RQ queue {damaged.rq_queue} is a string, not a list" in caplog.text
        assert web.get("/0/", follow_redirects=True).status_code == 200
    finally:
        client.delete(damaged.rq_queue)
        client.srem("rq:queues", damaged.rq_queue)


def test_rollq_replaces_the_queue_class_rq_dashboard_lists_queues_with() -> None:
    # Pins the rq-dashboard and RQ internals _DashboardQueue depends on: rq-dashboard's views name RQ's Queue as
    # rq_dashboard.web.Queue and list queues with Queue.all(connection=...), whose parameters the override repeats.
    import inspect

    import rq_dashboard.web as web
    from rq.queue import Queue

    from rollq.ops.dashboard import _DashboardQueue

    create_app("redis://127.0.0.1:1/0")
    assert web.Queue is _DashboardQueue
    assert "Queue.all(connection=current_app.redis_conn)" in inspect.getsource(web)
    assert list(inspect.signature(Queue.all).parameters) == list(inspect.signature(_DashboardQueue.all).parameters)


@pytest.mark.redis
def test_rq_dashboard_reads_redis_through_the_dashboards_connection_with_its_socket_timeout(
    redis_server: RedisServer, namespace: str
) -> None:
    # The operator's audit: rq-dashboard built a client of its own (rq_dashboard.web.from_url, redis_sentinel_url's
    # connect), at start and again before every /<instance>/... request, with redis-py's default socket timeout: none
    # before redis-py 8, so its pages and JSON hung on a stalled Redis (tests/ops/test_scrape_stall.py). Pins the
    # internals rollq's replacement relies on: both call from_url, and its views read current_app.redis_conn.
    import inspect

    import rq_dashboard.web as web

    from rollq.ops.metrics import SCRAPE_SOCKET_TIMEOUT_SECONDS

    for function in (web.setup_rq_connection, web.push_rq_connection):
        assert "from_url(" in inspect.getsource(function), function
    assert "connection=current_app.redis_conn" in inspect.getsource(web.list_queues)
    app = create_app(redis_server.url, namespace)
    ours = app.config["ROLLQ_CONNECTION"]
    assert app.redis_conn is ours  # type: ignore[attr-defined]
    for path in ("/0/data/queues.json", "/0/view/workers", "/"):
        assert app.test_client().get(path).status_code == 200, path
        assert app.redis_conn is ours, path  # type: ignore[attr-defined]
    assert ours.connection_pool.connection_kwargs["socket_timeout"] == SCRAPE_SOCKET_TIMEOUT_SECONDS


def test_rollq_lets_redis_being_down_reach_its_503_where_rq_dashboards_front_page_caught_it() -> None:
    # Pins the rq-dashboard internals _RedisDownIsNotCaughtHere depends on: its queues page catches redis-py's
    # ConnectionError by the name RedisConnectionError of its module, looked up when the page is rendered, and
    # answers 200 "Connection Error" with it (tests/ops/test_scrape_stall.py: Redis down is a 503 on `/`).
    import inspect

    import rq_dashboard.web as web

    from rollq.ops.dashboard import _RedisDownIsNotCaughtHere

    source = inspect.getsource(web.queues_overview)
    assert "except RedisConnectionError:" in source and "Connection Error" in source
    assert inspect.getsource(web).count("RedisConnectionError") == 2  # its import and that one except
    create_app("redis://127.0.0.1:1/0")
    assert web.RedisConnectionError is _RedisDownIsNotCaughtHere


@pytest.mark.redis
def test_rq_dashboard_instance_that_does_not_exist_is_a_404_naming_the_instances_that_do(
    own_redis: Callable[..., RedisServer], namespace: str
) -> None:
    # The operator's audit: /1/... (an rq-dashboard instance number past the one Redis the dashboard reads) answered
    # 500: rq-dashboard's before_request raised LookupError("Index exceeds RQ list. Not Permitted.").
    server = own_redis(password=PASSWORD)
    web = create_app(server.url, namespace).test_client()
    masked = f"redis://:***@127.0.0.1:{server.port}/0"
    for path in (
        "/1/",
        "/1/view/queues",
        "/1/view/workers",
        "/7/view/job/x",
        f"/1/view/jobs/{namespace}/queued/8/asc/1",
    ):
        response = web.get(path)
        text = response.get_data(as_text=True)
        assert response.status_code == 404, (path, response.status_code, text[:300])
        assert (
            text
            == f"there is no rq-dashboard instance {path.split('/')[1]}; this dashboard has instance 0 ({masked})\n"
        )
        assert response.mimetype == "text/plain"
    for path in ("/1/data/queues.json", "/1/data/workers.json", "/1/data/job/x.json"):
        response = web.get(path)
        assert response.status_code == 404, (path, response.status_code, response.get_data(as_text=True)[:300])
        assert response.json == {
            "error": f"there is no rq-dashboard instance 1; this dashboard has instance 0 ({masked})"
        }
    assert all(PASSWORD not in web.get(p).get_data(as_text=True) for p in ("/1/", "/1/data/queues.json"))
    assert web.get("/0/view/workers").status_code == 200 and web.get("/0/data/queues.json").status_code == 200
