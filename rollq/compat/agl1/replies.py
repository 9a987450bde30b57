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


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in a request body (AL's shapes need a handful)."""


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_json(raw: bytes, default: Any = None) -> Any:
    """A request body's JSON (``default`` when empty): 400 if it is not UTF-8 or nests deeper than
    :data:`MAX_JSON_DEPTH`, ``ValueError`` if it is not JSON. (Bodies over the server's byte limit never get here:
    aiohttp answers 413.)"""
    if not raw:
        return default
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # JSON is UTF-8 (RFC 8259); a ValueError would fall through to pydantic
        raise BadRequest(
            400, f"the body is not UTF-8: byte {exc.start} is {raw[exc.start : exc.start + 1]!r}"
        ) from None
    try:
        value = json.loads(text)
    except RecursionError:
        value = None
        too_deep = True
    else:
        too_deep = _depth(value) > MAX_JSON_DEPTH
    if too_deep:
        raise BadRequest(400, f"the body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    return value


async def json_body(request: web.Request, default: Any = None) -> Any:
    """The body as JSON (see :func:`parse_json`); 400 if it is not JSON."""
    try:
        return parse_json(await request.read(), default)
    except ValueError:
        raise BadRequest(400, "Invalid JSON in request body") from None


async def body(request: web.Request, shape: Any) -> Any:
    """The JSON body validated as ``shape`` (a model or a type such as ``list[Model]``); 422 like FastAPI (400 for
    one nested too deep)."""
    raw = await request.read()
    adapter = TypeAdapter(shape)
    try:
        try:
            value = parse_json(raw)
        except ValueError:  # not JSON: pydantic says so in FastAPI's words
            return adapter.validate_json(raw)
        return adapter.validate_python(value)
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
