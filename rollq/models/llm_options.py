"""rollq's extensions of an ``LLM`` resource, kept where readers of the seed schema still parse them.

The seed contract's ``LLM`` has exactly ``endpoint``, ``model`` and ``sampling_parameters`` (a free-form
dict). rollq adds nothing to that class: what the capturing proxy needs beyond it lives in
``sampling_parameters["rollq"]`` (:data:`OPTIONS_KEY`), a dict that any reader of the seed schema parses as
one more sampling entry. ``endpoint`` stays a real, callable upstream (the first of :attr:`LLMOptions.endpoints`),
so a reader that knows nothing of the extension still calls a working server.

The worker never shows the reserved entry to an agent: :func:`for_agent` strips it, so an agent that passes
``**sampling_parameters`` to its client does not send an unknown ``rollq`` argument.

>>> from rollq.models.contract import LLM
>>> llm = with_options(LLM(endpoint="http://a:8000/v1", model="m"), endpoints=["http://a:8000/v1", "http://b:8000/v1"],
...                    modes={"train": {"temperature": 1.0}, "val": {"temperature": 0.0}})
>>> options_of(llm).upstreams(llm)
('http://a:8000/v1', 'http://b:8000/v1')
>>> "rollq" in for_agent(llm).sampling_parameters
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .contract import LLM, NamedResources
from .errors import RollqError

OPTIONS_KEY = "rollq"
"""The reserved key of ``LLM.sampling_parameters`` that holds :class:`LLMOptions`."""

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Upstream answers that are retried (with backoff), like connection errors."""


class InvalidLLMOptionsError(RollqError, ValueError):
    """``sampling_parameters["rollq"]`` of an LLM resource that is not a valid :class:`LLMOptions`."""


class LLMOptions(BaseModel):
    """How the capturing proxy treats calls to one LLM resource.

    Every field has a default, so ``{}`` (or no entry at all) is the behaviour of a plain ``LLM``: one upstream,
    the agent's own sampling settings, logprobs asked for in ``train`` mode.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: tuple[str, ...] = ()
    """Every inference server of this resource (same model, same weights). Empty: only ``LLM.endpoint``. When
    given, ``LLM.endpoint`` must be one of them. Each rollout sticks to one of them (prefix-cache reuse)."""
    modes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Sampling settings enforced per task mode (``{"train": {"temperature": 1.0}, "val": {"temperature": 0}}``):
    the proxy overwrites what the agent sent and records that it did. A task without a mode gets none."""
    train_logprobs: bool = True
    """Ask the upstream for the logprobs of the sampled tokens on every call of a ``train`` task."""
    retries: int = Field(default=3, ge=0, le=20)
    """Retries of a call the upstream answered 429/502/503/504 or could not be reached for; 0 = none."""
    backoff_seconds: float = Field(default=0.2, ge=0, le=60)
    """The wait before the first retry; it doubles each retry (with jitter), up to ``backoff_max_seconds``."""
    backoff_max_seconds: float = Field(default=5.0, ge=0, le=600)
    """The longest wait between two retries."""
    eject_seconds: float = Field(default=10.0, ge=0, le=3600)
    """How long a failing upstream is left out of the routing; 0 = never."""
    eject_after: int = Field(default=3, ge=1, le=100)
    """Answers 502/503/504 in a row that take an upstream out; one that cannot be reached is taken out at once."""

    @field_validator("endpoints")
    @classmethod
    def _http_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for endpoint in value:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {endpoint!r} is not an http(s) URL")
        if len({e.rstrip("/") for e in value}) != len(value):
            raise ValueError("endpoints lists one server twice")
        suffixes = {e.rstrip("/").endswith("/v1") for e in value}
        if len(suffixes) > 1:
            raise ValueError("endpoints must all end in /v1 or none of them: the proxy appends the same path")
        return value

    def upstreams(self, llm: LLM) -> tuple[str, ...]:
        """The servers calls may go to, without trailing slashes: ``endpoints``, or the LLM's endpoint alone."""
        return tuple(e.rstrip("/") for e in self.endpoints) or (llm.endpoint.rstrip("/"),)

    def sampling_for(self, mode: str | None) -> dict[str, Any]:
        """The sampling settings enforced for tasks of ``mode`` (empty for none)."""
        return dict(self.modes.get(mode, {})) if mode else {}


def options_of(llm: LLM) -> LLMOptions:
    """The options of ``llm`` (defaults when it has none); :class:`InvalidLLMOptionsError` naming the problem."""
    raw = llm.sampling_parameters.get(OPTIONS_KEY)
    if raw is None:
        return LLMOptions()
    try:
        options = LLMOptions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(options)'}: {e['msg']}" for e in exc.errors())
        raise InvalidLLMOptionsError(f"sampling_parameters[{OPTIONS_KEY!r}] of LLM {llm.model!r}: {problems}") from exc
    if options.endpoints and llm.endpoint.rstrip("/") not in options.upstreams(llm):
        raise InvalidLLMOptionsError(
            f"LLM {llm.model!r}: endpoint {llm.endpoint!r} is not one of "
            f"sampling_parameters[{OPTIONS_KEY!r}].endpoints (readers that know nothing of the extension call it)"
        )
    return options


def with_options(
    llm: LLM,
    *,
    endpoints: Sequence[str] | None = None,
    modes: Mapping[str, Mapping[str, Any]] | None = None,
    **settings: Any,
) -> LLM:
    """A copy of ``llm`` carrying rollq's options (validated); ``settings`` are the other :class:`LLMOptions`
    fields. With ``endpoints`` and an ``llm.endpoint`` not among them, the endpoint becomes the first one."""
    given: dict[str, Any] = dict(llm.sampling_parameters.get(OPTIONS_KEY) or {})
    if endpoints is not None:
        given["endpoints"] = list(endpoints)
    if modes is not None:
        given["modes"] = {mode: dict(values) for mode, values in modes.items()}
    given.update(settings)
    checked = LLMOptions.model_validate(given)
    endpoint = llm.endpoint
    if checked.endpoints and endpoint.rstrip("/") not in checked.upstreams(llm):
        endpoint = checked.endpoints[0]
    sampling = {**llm.sampling_parameters, OPTIONS_KEY: checked.model_dump(mode="json", exclude_defaults=True)}
    made = llm.model_copy(update={"endpoint": endpoint, "sampling_parameters": sampling})
    options_of(made)  # the endpoint rule
    return made


def for_agent(llm: LLM, **update: Any) -> LLM:
    """``llm`` as an agent sees it: without the reserved entry (and with ``update`` applied)."""
    if OPTIONS_KEY in llm.sampling_parameters:
        update["sampling_parameters"] = {k: v for k, v in llm.sampling_parameters.items() if k != OPTIONS_KEY}
    return llm.model_copy(update=update) if update else llm


def check_resources(resources: NamedResources) -> None:
    """Raise :class:`InvalidLLMOptionsError` for the first LLM resource whose options are invalid."""
    for name, resource in resources.items():
        if isinstance(resource, LLM):
            try:
                options_of(resource)
            except InvalidLLMOptionsError as exc:
                raise InvalidLLMOptionsError(f"resource {name!r}: {exc}") from exc


def agent_view(resources: NamedResources) -> NamedResources:
    """``resources`` with every LLM's reserved entry stripped (what an agent sees when nothing is captured)."""
    if not any(isinstance(r, LLM) and OPTIONS_KEY in r.sampling_parameters for r in resources.values()):
        return resources
    return {name: for_agent(r) if isinstance(r, LLM) else r for name, r in resources.items()}
