"""The file registry (the embedded default, one host, no Redis).

The state of collection ``c`` is ``<index_root>/<c>/REGISTRY.json`` (state and history), rewritten by an
atomic rename (:mod:`engine.io.atomic`) while holding an exclusive ``flock`` on ``<c>/.registry.lock``; the
legacy ``<c>/LIVE`` pointer is kept in sync (written after the state file).  Replica reports are one small
file per replica under ``<c>/.replicas/``.  Subscribers poll the state file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

from engine.io import atomic
from engine.registry.base import Registry, Subscription
from engine.registry.state import COLLECTION_NAME, HISTORY_LIMIT, RegistryError, RegistryState, finish
from engine.version import store

log = logging.getLogger(__name__)

STATE_FILE = "REGISTRY.json"
LOCK_FILE = ".registry.lock"
REPLICAS_DIR = ".replicas"


class FileRegistry(Registry):
    """Registry on the index volume (single host).  See the module docstring for the files.

    Args:
        index_root: root of index versions (``<index_root>/<collection>/<version>/``).
        mirror_live: keep ``<collection>/LIVE`` equal to the registry's live version.
    """

    kind = "file"

    def __init__(self, index_root: Path | str, *, mirror_live: bool = True):
        self.index_root = Path(index_root)
        self.mirror_live = mirror_live

    def _dir(self, collection: str) -> Path:
        if not COLLECTION_NAME.match(collection or ""):
            raise RegistryError("invalid_version", f"{collection!r} is not a valid collection name")
        return self.index_root / collection

    def _read(self, collection: str) -> dict:
        path = self._dir(collection) / STATE_FILE
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
        # no registry yet: adopt the legacy LIVE pointer (revision 0)
        live = store.read_live_pointer(self._dir(collection))
        return {"state": RegistryState(collection, live=live).as_dict(), "history": []}

    @staticmethod
    def _state_of(raw: dict) -> RegistryState:
        s = dict(raw["state"])
        s["candidates"] = tuple(s.get("candidates") or ())
        return RegistryState(**s)

    def get(self, collection: str) -> RegistryState:
        """See :meth:`engine.registry.base.Registry.get` (the state file, or the legacy LIVE pointer at revision 0)."""
        return self._state_of(self._read(collection))

    def history(self, collection: str, limit: int = 100) -> list[dict]:
        """See :meth:`engine.registry.base.Registry.history`."""
        return self._read(collection)["history"][-limit:]

    @contextlib.contextmanager
    def _locked(self, collection: str) -> Iterator[Path]:
        d = self._dir(collection)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield d
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _transact(self, collection, fn):
        with self._locked(collection) as d:
            raw = self._read(collection)
            state = self._state_of(raw)
            change = fn(state)
            if change is None:
                return state
            new, event = finish(state, change)
            doc = {"state": new.as_dict(), "history": (raw["history"] + [event])[-HISTORY_LIMIT:]}
            atomic.write_json(d / STATE_FILE, doc, indent=1)
            if self.mirror_live and new.live is not None and new.live != store.read_live_pointer(d):
                try:
                    store.write_live_pointer(d, new.live)
                except store.IndexVersionError as e:  # not a complete version here: replicas refuse it too
                    log.warning("LIVE pointer of %s not updated: %s", collection, e)
            return new

    def report_replica(self, collection, replica, report):
        """Write the report; on a read-only index volume reports are skipped (logged once)."""
        d = self._dir(collection) / REPLICAS_DIR
        try:
            d.mkdir(parents=True, exist_ok=True)
            atomic.write_json(d / f"{_safe(replica)}.json", {**report, "replica": replica, "ts": time.time()},
                              indent=1, fsync=False)
        except OSError as e:
            if not getattr(self, "_report_warned", False):
                log.warning("cannot write replica reports under %s (%s); warm reports are unavailable", d, e)
                self._report_warned = True

    def replicas(self, collection):
        """See :meth:`engine.registry.base.Registry.replicas` (unreadable reports are skipped)."""
        d = self._dir(collection) / REPLICAS_DIR
        out = {}
        if d.is_dir():
            for p in d.glob("*.json"):
                with contextlib.suppress(OSError, json.JSONDecodeError):
                    rep = json.loads(p.read_text(encoding="utf-8"))
                    out[rep.get("replica", p.stem)] = rep
        return out

    def subscribe(self, collection):
        """A subscription polling the collection's state file."""
        return _FileSubscription(self._dir(collection) / STATE_FILE)


class _FileSubscription(Subscription):
    """Polls the state file's (inode, size, mtime) every 0.1 s."""

    def __init__(self, path: Path):
        self.path = path
        self.last = self._sig()

    def _sig(self):
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def wait(self, timeout_s):
        """See :meth:`engine.registry.base.Subscription.wait` (polls every 0.1 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            sig = self._sig()
            if sig != self.last:
                self.last = sig
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:128] or "_"

