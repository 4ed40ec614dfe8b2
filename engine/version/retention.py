"""Version retention: which index versions of a collection to keep on disk, deleting the others, and the disk
check a build runs before it starts (issue 18 item 6).

**The rule.**  Of a collection's complete versions (:func:`engine.version.store.list_versions`, oldest first)
keep

* the registry's ``live`` and ``previous`` versions and every candidate,
* the newest ``keep_last`` versions (the setting ``keep_versions``),
* every *leased* version: one that a fresh replica report (younger than ``lease_fresh_s``;
  :meth:`engine.registry.base.Registry.replicas`) names as its ``live`` version or among its ``warm`` ones, however
  old it is;

and delete the rest, oldest first.  :func:`decide` is that rule, a pure function; :func:`leases` reads the leases
out of replica reports; :func:`apply_retention` lists the directories, decides and deletes.

**Deletion is atomic per version.**  :func:`delete_version` renames ``<collection>/<version>`` to
``<collection>/.trash-<version>`` (one rename: the version is gone from every listing at once, a name starting
with a dot is never a version) and then removes the trash.  A crash between the two leaves only a ``.trash-*``
directory, which the next retention run removes.

**Disk check.**  :func:`estimate_version_bytes` estimates a new version's bytes (the live version's size scaled by
the new document count, or twice the corpus embeddings when there is no live version) and :func:`check_free_space`
refuses (:class:`DiskSpaceError`) when that does not fit in the free bytes less a margin.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.registry.state import RegistryState
from engine.version.store import list_versions

TRASH_PREFIX = ".trash-"

log = logging.getLogger(__name__)


class DiskSpaceError(ValueError):
    """A build or fold would not fit on the index volume (``needed`` and ``free`` bytes, ``margin`` kept free)."""

    def __init__(self, needed: int, free: int, margin: int, where: Path | str):
        self.needed, self.free, self.margin = int(needed), int(free), int(margin)
        super().__init__(f"not enough disk space under {where}: the new version needs about {self.needed:,} bytes, "
                         f"{self.free:,} bytes are free and {self.margin:,} are kept free (setting "
                         f"disk_margin_bytes); free space or delete old versions (python -m trainer retention)")


@dataclass
class RetentionPlan:
    """What :func:`decide` keeps and deletes.

    Attributes:
        kept: version -> the reasons it is kept (``live``, ``previous``, ``candidate``, ``newest``,
            ``leased:<replica>``), oldest version first.
        deleted: the versions to delete, oldest first.
    """

    kept: dict[str, list[str]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)


def leases(replicas: Mapping[str, Mapping], now: float, fresh_s: float) -> dict[str, list[str]]:
    """Version -> the replicas leasing it: those whose report (``ts`` unix seconds) is at most ``fresh_s`` old
    and names the version as ``live`` or among ``warm``."""
    out: dict[str, list[str]] = {}
    for replica, rep in sorted(replicas.items()):
        if now - float(rep.get("ts", 0) or 0) > fresh_s:
            continue
        held = set(rep.get("warm") or ())
        if rep.get("live"):
            held.add(rep["live"])
        for v in held:
            out.setdefault(v, []).append(replica)
    return out


def decide(versions: Iterable[str], state: RegistryState | None, leased: Mapping[str, Iterable[str]],
           keep_last: int) -> RetentionPlan:
    """The retention rule (module docstring) over ``versions`` (names sort oldest first).

    Args:
        versions: the complete versions on disk.
        state: the collection's registry state (None: no registry state, only ``keep_last`` and leases protect).
        leased: version -> replicas leasing it (:func:`leases`).
        keep_last: how many of the newest versions are kept whatever else holds (>= 0).
    """
    ordered = sorted(set(versions))
    reasons: dict[str, list[str]] = {v: [] for v in ordered}

    def keep(v: str | None, why: str) -> None:
        if v in reasons:
            reasons[v].append(why)

    if state is not None:
        keep(state.live, "live")
        keep(state.previous, "previous")
        for c in state.candidates:
            keep(c, "candidate")
    for v in ordered[len(ordered) - keep_last:] if keep_last > 0 else []:
        keep(v, "newest")
    for v, replicas in leased.items():
        for r in replicas:
            keep(v, f"leased:{r}")
    return RetentionPlan(kept={v: why for v, why in reasons.items() if why},
                         deleted=[v for v, why in reasons.items() if not why])


def directory_bytes(path: Path | str) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist; links are not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.lstat(os.path.join(dirpath, f))
            except FileNotFoundError:
                continue
            total += st.st_size
    return total


def collection_bytes(collection_dir: Path | str) -> int:
    """Bytes of a collection's complete version directories (drafts and trash not counted)."""
    d = Path(collection_dir)
    return sum(directory_bytes(d / v) for v in list_versions(d))


def delete_version(collection_dir: Path | str, version: str) -> bool:
    """Delete one version atomically: rename it to ``.trash-<version>``, then remove that; False when the version
    was already gone (another retention run moved it)."""
    d = Path(collection_dir)
    trash = d / f"{TRASH_PREFIX}{version}"
    try:
        os.rename(d / version, trash)
    except FileNotFoundError:
        return False
    shutil.rmtree(trash, ignore_errors=True)
    return True


def clean_trash(collection_dir: Path | str) -> list[str]:
    """Remove the ``.trash-*`` directories a crashed deletion left; returns their names."""
    d = Path(collection_dir)
    removed = []
    for p in sorted(d.glob(f"{TRASH_PREFIX}*")) if d.is_dir() else []:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


def apply_retention(collection_dir: Path | str, state: RegistryState | None, replicas: Mapping[str, Mapping], *,
                    keep_last: int, lease_fresh_s: float, dry_run: bool = False, now: float | None = None) -> dict:
    """Decide (:func:`decide`) over the versions on disk and delete the others, oldest first (none with
    ``dry_run``).  Returns ``{"kept": {version: reasons}, "deleted": [...], "dry_run", "bytes_freed",
    "bytes_on_disk", "trash_removed"}`` (``bytes_on_disk`` after the deletions)."""
    d = Path(collection_dir)
    now = time.time() if now is None else now
    plan = decide(list_versions(d), state, leases(replicas, now, lease_fresh_s), keep_last)
    trash = [] if dry_run else clean_trash(d)
    freed, deleted = 0, []
    for v in plan.deleted:
        size = directory_bytes(d / v)
        if dry_run or delete_version(d, v):
            freed += size
            deleted.append(v)
    if deleted and not dry_run:
        log.info("retention of %s deleted %d version(s), %d bytes: %s", d.name, len(deleted), freed, deleted)
    return {"kept": plan.kept, "deleted": deleted, "dry_run": dry_run, "bytes_freed": freed,
            "bytes_on_disk": collection_bytes(d) - (freed if dry_run else 0), "trash_removed": trash}


def estimate_version_bytes(*, documents: int, live_bytes: int | None, live_documents: int | None,
                           dimension: int) -> int:
    """Bytes a new version of ``documents`` documents will take: the live version's bytes scaled by the document
    count, or, with no live version, twice the float32 corpus embeddings (``documents`` x ``dimension`` x 4)."""
    if live_bytes is not None and live_documents:
        return int(live_bytes * documents / live_documents)
    return 2 * int(documents) * int(dimension) * 4


def free_disk_bytes(path: Path | str) -> int:
    """Free bytes of the file system holding ``path`` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(where: Path | str, needed: int, margin: int,
                     free_bytes: Callable[[Path], int] | None = None) -> int:
    """Return the free bytes of ``where`` (``free_bytes``, default :func:`free_disk_bytes`); raise
    :class:`DiskSpaceError` when ``needed`` + ``margin`` exceeds them."""
    free = int((free_bytes or free_disk_bytes)(Path(where)))
    if needed + margin > free:
        raise DiskSpaceError(needed, free, margin, where)
    return free
