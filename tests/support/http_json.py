"""JSON over HTTP for tests that speak to rollq's servers as a plain client would (urllib, no session)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200, (url, response.status)
        return json.loads(response.read())


def post_json(url: str, payload: Any, timeout: float = 10) -> Any:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())
