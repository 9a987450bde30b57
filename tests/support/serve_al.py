"""A client of ``rollq serve-al`` speaking Agent Lightning 0.1's HTTP API (what ``AgentLightningClient`` sends)."""

from __future__ import annotations

import urllib.error

from tests.support.http_json import get_json


def take_task(endpoint: str) -> str:
    """The id of the next task ``endpoint`` hands out (``<rollout_id>#<attempt>#<token>``)."""
    answer = get_json(endpoint + "task")
    assert answer["is_available"], answer
    return str(answer["task"]["rollout_id"])


def answers(endpoint: str) -> bool:
    """Whether the gateway answers; not with GET /task, which would claim a task (no resources: a 404)."""
    try:
        get_json(endpoint + "resources/latest")
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True
