"""Versioned resources: immutable numbered versions and a "latest" pointer.

Publishing writes the new version and moves the pointer in one transaction, so
a reader never sees a pointer to a version that is not there. Old versions are
pruned down to ``keep_versions``, except the latest and any version an
unfinished task is pinned to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import redis
from pydantic import TypeAdapter

from rollq.models.contract import ResourcesUpdate
from rollq.models.errors import ContractShapeError, InvalidResourcesError, UnknownResourcesError
from rollq.models.finite import non_finite_at
from rollq.models.llm_options import check_resources
from rollq.models.resource_kinds import ResourcesVersion, StoredResource

from .keys import Keys

_NAMED: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, StoredResource])


class ResourceStore:
    """Resources versions of one namespace."""

    def __init__(self, connection: redis.Redis, keys: Keys, keep_versions: int = 10) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be at least 1")
        self.connection = connection
        self.keys = keys
        self.keep_versions = keep_versions

    def publish(self, resources: Mapping[str, Any]) -> str:
        """Store ``resources`` as a new version, make it the latest, and return its id (``v1``, ``v2``, ...).

        :class:`InvalidLLMOptionsError` for an LLM whose ``sampling_parameters["rollq"]`` is not valid."""
        named = _NAMED.validate_python(dict(resources))
        check_resources(named)  # rollq's LLM options: refused here rather than by every worker that reads them
        dumped = {name: resource.model_dump() for name, resource in named.items()}
        if where := non_finite_at(dumped, "resources"):
            raise ContractShapeError(
                f"{where} is not a finite number, which JSON cannot carry (it would be stored as null)", field=where
            )
        number = int(self.connection.incr(self.keys.resources_seq))
        resources_id = f"v{number}"
        update = ResourcesVersion(resources_id=resources_id, resources=named)
        pipe = self.connection.pipeline(transaction=True)
        pipe.set(self.keys.resources(resources_id), update.model_dump_json())
        pipe.set(self.keys.resources_latest, resources_id)
        pipe.zadd(self.keys.resources_versions, {resources_id: number})
        pipe.execute()
        self.prune()
        return resources_id

    def get(self, resources_id: str | None = None) -> ResourcesUpdate:
        """A version by id, or the latest with None; :class:`UnknownResourcesError` if there is none."""
        if resources_id is None:
            latest = self.connection.get(self.keys.resources_latest)
            if latest is None:
                raise UnknownResourcesError(None, self.keys.namespace)
            resources_id = cast(bytes, latest).decode()
        raw = self.connection.get(self.keys.resources(resources_id))
        if raw is None:
            raise UnknownResourcesError(resources_id, self.keys.namespace)
        try:
            return ResourcesVersion.model_validate_json(raw)
        except ValueError as exc:  # pydantic's ValidationError, a JSON error
            raise InvalidResourcesError(
                f"resources version {resources_id} of namespace {self.keys.namespace!r} is not valid: {str(exc)[:500]}"
            ) from None

    def versions(self) -> list[str]:
        """Ids of the kept versions, oldest first."""
        return [v.decode() for v in cast(list[bytes], self.connection.zrange(self.keys.resources_versions, 0, -1))]

    def latest_id(self) -> str | None:
        """The id of the latest version, if any."""
        latest = self.connection.get(self.keys.resources_latest)
        return cast(bytes, latest).decode() if latest else None

    def prune(self) -> list[str]:
        """Drop versions beyond ``keep_versions`` that no unfinished task is pinned to; return their ids."""
        k = self.keys
        with self.connection.pipeline(transaction=True) as pipe:
            while True:
                try:
                    # Watching the refs hash makes a concurrent enqueue that pins a version abort this prune.
                    pipe.watch(k.resources_refs, k.resources_latest)
                    oldest = cast(list[bytes], pipe.zrange(k.resources_versions, 0, -self.keep_versions - 1))
                    candidates = [v.decode() for v in oldest]
                    pinned = {v.decode() for v in cast(list[bytes], pipe.hkeys(k.resources_refs))}
                    latest = cast(bytes | None, pipe.get(k.resources_latest))
                    drop = [v for v in candidates if v not in pinned and (latest is None or v != latest.decode())]
                    pipe.multi()
                    for version in drop:
                        pipe.delete(k.resources(version))
                    if drop:
                        pipe.zrem(k.resources_versions, *drop)
                    pipe.execute()
                    return drop
                except redis.WatchError:
                    continue
