"""The version registry: which index version of a collection is live, which was, which are candidates.

Modules, one responsibility each:

=============================  ===================================================================
:mod:`engine.registry.state`   :class:`RegistryState`, errors, the pure state transitions
:mod:`engine.registry.base`    the :class:`Registry` interface and :class:`Subscription`
:mod:`engine.registry.file`    :class:`FileRegistry`: ``REGISTRY.json`` under flock, the ``LIVE`` mirror
:mod:`engine.registry.redis_store`  :class:`RedisRegistry`: a hash per collection, compare-and-set, pub/sub
=============================  ===================================================================

:func:`open_registry` picks the backend from the settings.  The registry stores names only; verifying a
version's files is the caller's job (:func:`engine.version.manifest.verify`: the trainer CLI, the gateway's
admin endpoints, every replica).
"""

from __future__ import annotations

from pathlib import Path

from engine.registry.base import Registry
from engine.registry.file import FileRegistry
from engine.registry.redis_store import RedisRegistry


def open_registry(*, redis_url: str | None, index_root: Path | str, mirror_live: bool = True) -> Registry:
    """The Redis registry when ``redis_url`` is set, else the file registry on ``index_root``."""
    if redis_url:
        return RedisRegistry(redis_url, mirror_root=index_root if mirror_live else None)
    return FileRegistry(index_root, mirror_live=mirror_live)
