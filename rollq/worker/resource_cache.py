"""A worker's cache of resources versions; versions never change, so caching by id is always safe."""

from __future__ import annotations

import threading
from collections import OrderedDict

from rollq.models.contract import NamedResources
from rollq.store.resources import ResourceStore


class ResourceCache:
    """The most recently used ``size`` versions of one namespace."""

    def __init__(self, store: ResourceStore, size: int = 32) -> None:
        self.store = store
        self.size = size
        self._lock = threading.Lock()
        self._versions: OrderedDict[str, NamedResources] = OrderedDict()

    def get(self, resources_id: str) -> NamedResources:
        """The resources of ``resources_id``; :class:`UnknownResourcesError` if it does not exist."""
        with self._lock:
            if resources_id in self._versions:
                self._versions.move_to_end(resources_id)
                return self._versions[resources_id]
        resources = self.store.get(resources_id).resources
        with self._lock:
            self._versions[resources_id] = resources
            while len(self._versions) > self.size:
                self._versions.popitem(last=False)
        return resources
