"""The dashboard at production size: 10,000 token-id rollouts of ~230 KB each (2.3 GB) in a real Redis.

Every page (and the JSON each polls, and ``/metrics``) is requested with the Redis bytes it cost measured
(``INFO stats`` ``total_net_output_bytes`` before and after), answered in under a second, and rendered in headless
Chromium. Before summaries, one rollouts-page view read 466 MB and took 10.7-13.6 s. The table this prints is the
one in docs/operations.md.

The rollouts are written straight into the store's format (pipelined XADD of the rollout and its summary, the task
record, the stats counters), as workers publishing them would leave them, not by running agents.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from rollq.models.contract import Rollout, Task, Triplet
from rollq.models.policy import RolloutPolicy
from rollq.producer import Producer
from rollq.store.keys import Keys, StreamField, TaskField, claim_field, end_field
from rollq.store.stats import outcome_stat, reward_bucket, reward_stat
from rollq.store.summaries import summary_json
from tests.support.browser import chromium, rendered_rows, require_chromium
from tests.support.dashboard import Dashboard
from tests.support.servers import RedisServer

ROLLOUTS = int(os.environ.get("DASHBOARD_SCALE_ROLLOUTS", "10000"))
VERSIONS = 14  # more than ten: v2 must sort before v10
BYTES_PER_VIEW = 4_000_000  # "a few MB" at most per page view
SECONDS_PER_VIEW = 1.0


def _template(rollout_id: str) -> str:
    """A ~230 KB rollout: 8 turns of 3,200 prompt and 1,600 response token ids."""
    triplets = [
        Triplet(
            prompt={"text": f"turn {t}", "token_ids": list(range(10_000 + t, 10_000 + t + 3200))},
            response={"text": "answer", "token_ids": list(range(20_000 + t, 20_000 + t + 1600))},
            reward=None,
        )
        for t in range(8)
    ]
    return Rollout(rollout_id=rollout_id, triplets=triplets, final_reward=0.5).model_dump_json()


def populate(client, keys: Keys, n: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Write ``n`` finished rollouts as workers would leave them; returns a few ids and cursors to visit."""
    placeholder = "rollout-PLACEHOLDER"
    body = _template(placeholder)
    template = Rollout.model_validate_json(body)
    policy = RolloutPolicy().model_dump_json()
    now = time.time() - n * 0.01
    found: dict[str, str] = {}
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        rid = f"rollout-{i:06d}"
        version = f"v{1 + i * VERSIONS // n}"
        failed = i % 10 == 7
        mode = "val" if i % 5 == 4 else "train"
        reward = None if failed else round(((i * 37) % 100) / 50.0 - 0.5, 3)  # -0.5 .. 1.48
        group = f"grp-{i // 8:032x}-8"
        meta = {"status": "failed" if failed else "succeeded", "attempt": 1, "worker": "w-1", "generation": 1}
        meta |= {"resources_id": version, "group_id": group, "group_index": i % 8, "group_size": 8}
        if failed:
            meta["error"] = {"type": "ValueError", "message": f"tool call returned HTTP 500 on {rid}"}
        # The summary the publisher builds (from a model without the payload: same counts, cheap to make).
        small = template.model_copy(update={"rollout_id": rid, "final_reward": reward, "metadata": meta})
        summary = summary_json(small, status=meta["status"], duration=1.0 + i % 7)
        payload = body.replace(placeholder, rid, 1)
        payload = payload.replace('"final_reward":0.5', f'"final_reward":{json.dumps(reward)}', 1)
        head, _, tail = payload.rpartition('"metadata":{}')  # the rollout's, last (triplets have one too)
        payload = head + '"metadata":' + json.dumps(meta) + tail
        when = now + i * 0.01
        result_id = f"{int(when * 1000)}-{i}"
        pipe.xadd(keys.results, {StreamField.ROLLOUT_ID: rid, StreamField.ROLLOUT: payload}, id=result_id)
        pipe.xadd(
            keys.summaries,
            {
                StreamField.ROLLOUT_ID: rid,
                StreamField.SUMMARY: summary,
                StreamField.MODE: mode,
                StreamField.RESULT: result_id,
            },
            id=result_id,
        )
        task = Task(rollout_id=rid, input={"question": f"q{i}"}, mode=mode, resources_id=version)  # type: ignore[arg-type]
        pipe.hset(
            keys.task(rid),
            mapping={
                TaskField.TASK: task.model_dump_json(),
                TaskField.POLICY: policy,
                TaskField.MODE: mode,
                TaskField.STATE: meta["status"],
                TaskField.CLAIMS: 1,
                TaskField.ATTEMPT: 1,
                TaskField.ATTEMPTS: 1,
                TaskField.WORKER: "w-1",
                TaskField.RESULT: result_id,
                TaskField.ENDED: when,
                TaskField.LAST_CLAIM: when - 1,
                claim_field(1): f"w-1|{when - 1}",
                end_field(1): f"{meta['status']}|{when}",
            },
        )
        pipe.hincrby(keys.stats, outcome_stat(meta["status"], mode), 1)
        if reward is not None:
            pipe.hincrby(keys.stats, reward_stat(mode, version, reward_bucket(reward)), 1)
            pipe.hincrbyfloat(keys.stats, reward_stat(mode, version, "sum"), reward)
        if i % 100 == 0:
            pipe.execute()
        if failed:
            found.setdefault("failed", rid)
        found["newest"] = rid
        found.setdefault("group", group)
    pipe.execute()
    return found


def redis_out_bytes(client) -> int:  # type: ignore[no-untyped-def]
    return int(client.info("stats")["total_net_output_bytes"])


@pytest.mark.redis
@pytest.mark.browser
@pytest.mark.slow
def test_every_dashboard_page_answers_in_under_a_second_reading_a_few_mb_at_10000_rollouts_of_230_kb(
    own_redis: Callable[..., RedisServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = require_chromium()
    server = own_redis()
    client = server.client()
    namespace = "scale"
    keys = Keys(namespace)
    producer = Producer.from_url(server.url, namespace)
    for v in range(VERSIONS):
        producer.update_resources({"llm": {"resource_type": "llm", "endpoint": "http://llm/v1", "model": f"m{v}"}})
    started = time.monotonic()
    ids = populate(client, keys, ROLLOUTS)
    written = time.monotonic() - started
    stored = int(client.info("memory")["used_memory"])
    print(f"wrote {ROLLOUTS} rollouts ({stored / 1e9:.2f} GB of Redis memory) in {written:.1f} s")

    monkeypatch.setenv("ROLLQ_NAMESPACE", namespace)
    dash = Dashboard(server.url, tmp_path / "dashboard.log")
    try:
        page2 = json.loads(urllib.request.urlopen(f"{dash.base}/rollq/api/rollouts", timeout=30).read())["before"]
        views = {
            "rollouts": "/rollq/",
            "rollouts, page 2": f"/rollq/?before={page2}",
            "rollouts, failed": "/rollq/?status=failed",
            "rollouts, version v7": "/rollq/?resources_id=v7",
            "rollouts, one group": f"/rollq/?group={ids['group']}",
            "rollout": f"/rollq/rollout/{ids['newest']}",
            "rollout, failed": f"/rollq/rollout/{ids['failed']}",
            "workers": "/rollq/workers",
            "charts": "/rollq/charts",
            "rollouts JSON (poll)": "/rollq/api/rollouts",
            "charts JSON (poll)": "/rollq/api/charts",
            "workers JSON (poll)": "/rollq/api/workers",
            "/metrics": "/metrics",
        }
        # INFO's own reply is counted by the next INFO: measure it with nothing in between.
        a = redis_out_bytes(client)
        info_cost = redis_out_bytes(client) - a
        table = []
        for name, path in views.items():
            urllib.request.urlopen(dash.base + path, timeout=60).read()  # warm: templates compiled, scripts loaded
            before = redis_out_bytes(client)
            t0 = time.perf_counter()
            with urllib.request.urlopen(dash.base + path, timeout=60) as response:
                html = response.read()
            seconds = time.perf_counter() - t0
            read = redis_out_bytes(client) - before - info_cost
            table.append((name, read, seconds, len(html)))
        print("\n| view | Redis bytes read | seconds | response bytes |\n|---|---:|---:|---:|")
        for name, read, seconds, size in table:
            print(f"| {name} | {read:,} | {seconds:.3f} | {size:,} |")
        for name, read, seconds, _ in table:
            assert read < BYTES_PER_VIEW, f"{name} read {read:,} bytes from Redis"
            assert seconds < SECONDS_PER_VIEW, f"{name} took {seconds:.2f} s"

        # In the browser: the rows, the filters, the charts in numeric version order, the rollout page.
        profile = tmp_path / "profile"
        base = f"{dash.base}/rollq"
        # Each page's time is its HTTP answer above: a page reads Redis only on the server, then only polls JSON.
        rows = rendered_rows(chromium(browser, profile, f"{base}/?refresh=0"), "rollout")
        assert len(rows) == 50 and rows[0][0] == ids["newest"]
        failed = rendered_rows(chromium(browser, profile, f"{base}/?status=failed&refresh=0"), "rollout")
        assert failed and {r[1] for r in failed} == {"failed"}
        v7 = rendered_rows(chromium(browser, profile, f"{base}/?resources_id=v7&refresh=0"), "rollout")
        assert v7 and {r[3] for r in v7} == {"v7"}
        charts = chromium(browser, profile, f"{base}/charts?refresh=0")
        ticks = [t.split(">")[-1] for t in charts.split("</text>") if 'class="tick"' in t]
        ticks = [t for t in ticks if t.startswith("v")]  # the reward chart's; the throughput chart's are times
        assert ticks == sorted(ticks, key=lambda v: int(v[1:])) and "v14" in ticks, ticks
        # Live: no reload; the page polls its JSON and re-renders the rows in place (each poll counted on <body>).
        live = chromium(browser, profile, f"{base}/", virtual_ms=16000)
        assert 'http-equiv="refresh"' not in live and 'data-polled="' in live, live[:400]
        assert len(rendered_rows(live, "rollout")) == 50
        page = chromium(browser, profile, f"{base}/rollout/{ids['failed']}?refresh=0")
        assert "tool call returned HTTP 500" in page and rendered_rows(page, "attempt")[0][:2] == ["1", "w-1"]
    finally:
        dash.stop()
        print(dash.log()[-2000:])
        client.flushall()  # 2.3 GB: give the memory back before the next test
