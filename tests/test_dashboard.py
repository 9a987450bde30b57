"""``rollq dashboard``: rq-dashboard on a Redis holding real rollq jobs, checked in headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rq.job import Job
from rq.queue import Queue
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer
from rq.worker import Worker
from servers import REPO, RedisServer, WorkerProcess, free_port

from rollq.models.errors import RollqError
from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from rollq.store.keys import job_id

ROLLQ = str(Path(sys.executable).parent / "rollq")
SCREENSHOTS = REPO / "docs" / "screenshots"
# The workers view shows all three at once: the busy worker, its rollq job and the namespace's queue.
SCREENSHOT_PAGES = {
    "dashboard.png": "/0/view/workers",
    "dashboard-queues.png": "/",
    "dashboard-jobs.png": "/0/view/jobs/{namespace}/finished/8/asc/1",
}
PASSWORD = "dashboard-test-secret"


def require_chromium() -> str:
    """Debian's chromium; under CI a missing one fails the test instead of skipping it."""
    binary = shutil.which("chromium")
    if binary is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI must not skip the browser test")
        pytest.skip(message)
    return binary


def chromium(binary: str, profile: Path, url: str, *, screenshot: Path | None = None, virtual_ms: int = 5000) -> str:
    """Load ``url`` headless, let its scripts run their first polls, and return the DOM (or write a screenshot)."""
    profile.mkdir(parents=True, exist_ok=True)
    # rq-dashboard fills its tables from JSON endpoints in page scripts; the
    # virtual time budget lets those requests and renders finish first.
    args = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={virtual_ms}",
    ]
    args += [f"--screenshot={screenshot}", "--window-size=1280,900"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed on {url}: {done.stderr[-2000:]}"
    return done.stdout


class RenderedRows(HTMLParser):
    """The cells of every ``<tr data-role=ROLE>`` the page's scripts rendered.

    Row templates sit inside ``<script type="text/template">``, whose content
    the parser keeps as text, so only rows that were really rendered count.
    """

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role
        self.rows: list[list[str]] = []
        self._depth = 0  # <tr> nesting inside a matching row; 0 = outside one
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr" and (self._depth or ("data-role", self.role) in attrs):
            if not self._depth:
                self.rows.append([])
            self._depth += 1
        elif tag == "td" and self._depth:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._depth:
            self._depth -= 1
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def rendered_rows(dom: str, role: str) -> list[list[str]]:
    parser = RenderedRows(role)
    parser.feed(dom)
    return parser.rows


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


class Dashboard:
    """``rollq dashboard`` in a subprocess, with the Redis URL (and its password) passed in the environment."""

    def __init__(self, redis_url: str, log_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115  # closed in stop()
        env = {**os.environ, "ROLLQ_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [ROLLQ, "dashboard", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        wait_for(self._answers, f"rq-dashboard on port {self.port} (log: {log_path})")

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"rollq dashboard exited: {self.log()}"
        try:
            with urllib.request.urlopen(self.base + "/", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Callable[[str], Dashboard]]:
    started: list[Dashboard] = []

    def start(redis_url: str) -> Dashboard:
        started.append(Dashboard(redis_url, tmp_path / f"dashboard-{len(started)}.log"))
        return started[-1]

    yield start
    for d in started:
        d.stop()
        print(f"--- {d.log_path.name} ---\n{d.log()[-4000:]}")


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
            "ROLLQ_AGENT": "tests.dashboard_agents:HoldingAgent",
            "ROLLQ_CONCURRENCY": "2",
            "ROLLQ_GRACE_SECONDS": "0",
        },
    )

    finished = [task.rollout_id for task in producer.enqueue_many([{"n": 1}, {"n": 2}], mode="train")]
    registry = FinishedJobRegistry(namespace, connection=client)
    finished_jobs = {job_id(rid) for rid in finished}
    wait_for(lambda: finished_jobs <= set(registry.get_job_ids(cleanup=False)), "RQ to record the finished jobs")
    for rollout_id in finished:
        # RQ drops a finished rollq job after 60 s; a slow machine must not lose it before the browser looks.
        client.persist(Job.key_for(job_id(rollout_id)))
    # Queued only after the others are done, so no finishing job clears the worker's current job.
    held = producer.enqueue({"hold": True}, mode="train").rollout_id

    def busy_with_held() -> bool:
        assert worker.process.poll() is None, f"worker exited: {worker.log()}"
        listed = Worker.all(connection=client, serializer=JSONSerializer)
        return any(w.get_current_job_id() == job_id(held) for w in listed)

    wait_for(busy_with_held, "the worker to run the held rollout")
    (rq_worker,) = Worker.all(connection=client, serializer=JSONSerializer)

    dash = dashboard(server.url)
    base = dash.base

    # The endpoint that was a 500 in rq-dashboard 0.9.0 while a worker was busy with a JSON job.
    (listed,) = get_json(f"{base}/0/data/workers.json")["workers"]
    assert listed["state"] == "busy" and listed["current_job"]["job_id"] == job_id(held)

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
    workers(server.url, namespace, env={"ROLLQ_AGENT": "tests.hostile_agents:HostileAgent"})
    (task,) = producer.enqueue_many([{"raise": payload}], metadata={"note": payload}, mode="train")
    (rollout,) = producer.wait([task.rollout_id], timeout=30)
    assert payload in rollout.metadata["error"]["message"]
    client = server.client()
    client.persist(Job.key_for(job_id(task.rollout_id)))

    base = dashboard(server.url).base
    # The pages that show the payload (as text), then the lists that link to it.
    for page in [f"/0/view/job/{job_id(task.rollout_id)}", f"/rollq/rollout/{task.rollout_id}"]:
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
