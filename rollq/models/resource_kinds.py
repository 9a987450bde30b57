"""The resources rollq stores beyond the contract's two: Agent Lightning 0.3's keyed ``LLM`` and its ``ProxyLLM``.

The contract (:mod:`rollq.models.contract`, pinned to the specification) knows ``LLM(endpoint, model,
sampling_parameters)`` and ``PromptTemplate``. AL 0.3 adds ``LLM.api_key`` and a ``ProxyLLM``
(``resource_type: "proxy_llm"``, an LLM whose ``get_base_url(rollout_id, attempt_id)`` addresses one attempt).
Validated against the contract, the key was dropped and a ``ProxyLLM`` refused; here they are kept:

- an ``llm`` with an ``api_key`` becomes a :class:`KeyedLLM` (an ``LLM`` with the key), one without stays the
  contract's ``LLM``, so nothing changes for resources that never had a key;
- a ``proxy_llm`` becomes a :class:`ProxyLLM` (a ``KeyedLLM``).

Both are ``LLM`` instances: the worker's capturing proxy points them at itself like any LLM, keeping the key.
:data:`StoredResource` is the union rollq validates and stores (:class:`ResourcesVersion` is a
``ResourcesUpdate`` over it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Tag

from .contract import LLM, PromptTemplate, ResourcesUpdate


class KeyedLLM(LLM):
    """An ``LLM`` with the API key the agent must send (AL 0.3's ``LLM.api_key``)."""

    api_key: Optional[str] = None  # noqa: UP045  # spelled as the contract spells its optional fields


class ProxyLLM(KeyedLLM):
    """AL 0.3's ``ProxyLLM``: an LLM endpoint that takes the rollout and attempt in its path.

    In a rollq worker the endpoint is the worker's capturing proxy, which attributes calls itself and drops
    the ``/rollout/<id>/attempt/<id>`` part before forwarding to the endpoint the trainer published.
    """

    resource_type: Literal["proxy_llm"] = "proxy_llm"  # type: ignore[assignment]

    def get_base_url(self, rollout_id: str | None = None, attempt_id: str | None = None) -> str:
        """The endpoint with ``/rollout/<rollout_id>/attempt/<attempt_id>`` before a trailing ``/v1``, as AL's."""
        if rollout_id is None and attempt_id is None:
            return self.endpoint
        if not (isinstance(rollout_id, str) and isinstance(attempt_id, str)):
            raise ValueError("rollout_id and attempt_id must be strings or both None")
        prefix = self.endpoint.rstrip("/")
        v1 = prefix.endswith("/v1")
        prefix = (prefix[:-3] if v1 else prefix) + f"/rollout/{rollout_id}/attempt/{attempt_id}"
        return prefix + "/v1" if v1 else prefix


def _kind(value: Any) -> str | None:
    fields = value if isinstance(value, dict) else getattr(value, "__dict__", {})
    kind = fields.get("resource_type")
    if kind == "llm" and fields.get("api_key") is not None:
        return "keyed_llm"
    return kind if isinstance(kind, str) else None


StoredResource = Annotated[
    Union[  # noqa: UP007
        Annotated[LLM, Tag("llm")],
        Annotated[KeyedLLM, Tag("keyed_llm")],
        Annotated[ProxyLLM, Tag("proxy_llm")],
        Annotated[PromptTemplate, Tag("prompt_template")],
    ],
    Discriminator(_kind),
]
"""One resource as rollq stores it: the contract's ``LLM``/``PromptTemplate``, a :class:`KeyedLLM` or a
:class:`ProxyLLM`."""


class ResourcesVersion(ResourcesUpdate):
    """A ``ResourcesUpdate`` whose resources may also be :class:`KeyedLLM` or :class:`ProxyLLM`."""

    resources: dict[str, StoredResource]  # type: ignore[assignment]
