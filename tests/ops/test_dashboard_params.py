"""rollq's dashboard pages and their JSON answer a bad query parameter with a 400 naming it, never a 500."""

from __future__ import annotations

import pytest

from rollq.ops.dashboard import create_app
from rollq.producer import Producer
from tests.support.servers import RedisServer

BAD = [
    ("before", "garbage"),
    ("before", "1-2-3"),
    ("before", "-1-0"),
    ("before", "99999999999999999999-0"),  # past 64 bits: Redis refuses it as a stream id
    ("status", "bogus"),
    ("mode", "training"),
]
CHART_BAD = [("bucket", "abc"), ("bucket", "0"), ("bucket", "3601"), ("bucket", "1.5")]


@pytest.mark.redis
@pytest.mark.parametrize(("name", "bad"), BAD)
def test_a_bad_rollouts_parameter_is_a_400_naming_it_in_json_and_html(
    redis_server: RedisServer, namespace: str, name: str, bad: str
) -> None:
    # An outside audit: /rollq/api/rollouts?before=garbage and /rollq/?before=garbage were a 500 with a traceback
    # (the value went straight into the summaries script's XREVRANGE).
    Producer.from_url(redis_server.url, namespace).enqueue({"n": 1})
    web = create_app(redis_server.url, namespace).test_client()

    api = web.get("/rollq/api/rollouts", query_string={name: bad})
    assert api.status_code == 400, api.get_data(as_text=True)
    assert api.is_json and api.get_json()["parameter"] == name
    assert name in api.get_json()["error"] and bad in api.get_json()["error"]

    page = web.get("/rollq/", query_string={name: bad})
    assert page.status_code == 400
    assert page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert f"?{name}=" in text and "Traceback" not in text


@pytest.mark.redis
@pytest.mark.parametrize(("name", "bad"), CHART_BAD)
def test_a_bad_charts_parameter_is_a_400_naming_it_not_a_silent_default(
    redis_server: RedisServer, namespace: str, name: str, bad: str
) -> None:
    web = create_app(redis_server.url, namespace).test_client()

    api = web.get("/rollq/api/charts", query_string={name: bad})
    assert api.status_code == 400
    assert api.get_json()["parameter"] == name
    page = web.get("/rollq/charts", query_string={name: bad})
    assert page.status_code == 400 and f"?{name}=" in page.get_data(as_text=True)


@pytest.mark.redis
def test_good_parameters_and_the_cursor_the_dashboard_hands_out_are_accepted(
    redis_server: RedisServer, namespace: str
) -> None:
    producer = Producer.from_url(redis_server.url, namespace)
    ids = [t.rollout_id for t in producer.enqueue_many([{"n": i} for i in range(3)], mode="train")]
    producer.cancel(ids)
    web = create_app(redis_server.url, namespace).test_client()

    first = web.get("/rollq/api/rollouts")
    assert first.status_code == 200
    for query in (
        {"before": "1700000000000-0"},
        {"before": ""},
        {"status": "cancelled", "mode": "train", "resources_id": "any text", "group": "g"},
        {"status": "", "mode": ""},
    ):
        assert web.get("/rollq/api/rollouts", query_string=query).status_code == 200, query
        assert web.get("/rollq/", query_string=query).status_code == 200, query
    for bucket in ("1", "60", "3600"):
        assert web.get("/rollq/api/charts", query_string={"bucket": bucket}).status_code == 200
