"""Request parsing and replies in FastAPI's shapes, which AL 1.0 clients read (``{"detail": ...}`` errors)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

T = TypeVar("T")


class BadRequest(Exception):
    """A request that cannot be served as sent: the status (400, 422) and FastAPI's ``detail``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


def reply(value: BaseModel | Sequence[BaseModel] | dict[str, Any], status: int = 200) -> web.Response:
    if isinstance(value, BaseModel):
        text = value.model_dump_json()
    elif isinstance(value, Sequence):
        text = "[" + ",".join(item.model_dump_json() for item in value) + "]"
    else:
        text = json.dumps(value)
    return web.Response(text=text, status=status, content_type="application/json")


def error(status: int, detail: Any) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


async def body(request: web.Request, shape: Any) -> Any:
    """The JSON body validated as ``shape`` (a model or a type such as ``list[Model]``); 422 like FastAPI."""
    raw = await request.read()
    try:
        return TypeAdapter(shape).validate_json(raw or b"null")
    except ValidationError as exc:
        raise BadRequest(422, json.loads(exc.json(include_url=False))) from None


def query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(422, [{"type": "int_parsing", "loc": ["query", name], "input": raw}]) from None


_TRUE = {"1", "true", "on", "yes", "t", "y"}
_FALSE = {"0", "false", "off", "no", "f", "n"}


def query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise BadRequest(422, [{"type": "bool_parsing", "loc": ["query", name], "input": raw}])
