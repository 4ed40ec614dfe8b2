"""Registry commands of the trainer CLI: ``publish``, ``promote``, ``rollback``, ``status``, ``list``.

They use the registry ``REDIS_URL`` selects (else the file registry on the
index volume).  Exit codes: 0 done, 2 refused (bad version, unknown candidate,
nothing to roll back to, quality gate, warm replicas missing), 3 registry
unreachable.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from engine.encoder import OnnxEncoder
from engine.gate import load_gate_config, run_gate
from engine.index import IndexVersion
from engine.registry import open_registry
from engine.registry.base import Registry
from engine.registry.state import RegistryError, RegistryUnavailable, check_version_name
from engine.version import store
from engine.version.manifest import Expect, IndexVersionError, Manifest, verify
from trainer.milvus_stage1 import write_for_settings


def add_commands(sub) -> None:
    """Add the registry sub-commands to the trainer's argument parser."""
    ls = sub.add_parser("list", help="list versions of a collection (* live, p previous, c candidate)")
    ls.add_argument("collection")

    pub = sub.add_parser("publish", help="verify a built version and register it as a candidate")
    pub.add_argument("collection")
    pub.add_argument("version")

    pro = sub.add_parser("promote", help="make a candidate live (after the quality gate, if configured)")
    pro.add_argument("collection")
    pro.add_argument("version", nargs="?", help="candidate to promote (default: the newest)")
    pro.add_argument("--require-warm", type=int, default=0, metavar="N",
                     help="wait until N replicas report the version warm before promoting")
    pro.add_argument("--wait-s", type=float, default=120.0, help="how long to wait for warm replicas, in seconds")
    pro.add_argument("--skip-gate", action="store_true", help="promote without the quality gate (recorded)")

    rb = sub.add_parser("rollback", help="swap live and previous on every replica")
    rb.add_argument("collection")
    rb.add_argument("--reason", help="why (recorded in the history)")

    st = sub.add_parser("status", help="registry state, recent history and replica reports as JSON")
    st.add_argument("collection")
    st.add_argument("--history", type=int, default=20, help="history events shown")


COMMANDS = ("list", "publish", "promote", "rollback", "status")


def _verify(settings, coll_dir: Path, version: str) -> Manifest:
    """The one verification (:func:`engine.version.manifest.verify`) against the configured encoder export."""
    check_version_name(version)
    return verify(coll_dir / version, Expect.of_export(settings.encoder_dir, collection=coll_dir.name, version=version))


def run(args, settings) -> int:
    """Execute one registry command; returns the exit code."""
    registry = open_registry(redis_url=settings.redis_url, index_root=settings.index_root)
    try:
        return _run(args, settings, registry)
    except RegistryUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except (RegistryError, IndexVersionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        registry.close()


def _run(args, settings, registry: Registry) -> int:
    coll = args.collection
    coll_dir = Path(settings.index_root) / coll
    actor = f"trainer {args.command}"
    if args.command == "list":
        st = registry.get(coll)
        for v in store.list_versions(coll_dir):
            mark = "*" if v == st.live else "p" if v == st.previous else "c" if v in st.candidates else " "
            print(f"{mark} {v}")
        return 0
    if args.command == "status":
        print(json.dumps({"registry": registry.kind, "state": registry.get(coll).as_dict(),
                          "history": registry.history(coll, args.history), "replicas": registry.replicas(coll)},
                         indent=2, sort_keys=True))
        return 0
    if args.command == "publish":
        _verify(settings, coll_dir, args.version)
        write_for_settings(settings, coll_dir / args.version)  # with stage 1 on Milvus: its collection first
        st = registry.publish(coll, args.version, actor=actor)
        print(json.dumps({"published": args.version, "state": st.as_dict()}))
        return 0
    if args.command == "rollback":
        st = registry.rollback(coll, reason=args.reason, actor=actor)
        print(json.dumps({"rolled_back_to": st.live, "state": st.as_dict()}))
        return 0
    if args.command == "promote":
        return _promote(args, settings, registry, coll, coll_dir, actor)
    raise ValueError(args.command)


def _promote(args, settings, registry: Registry, coll: str, coll_dir: Path, actor: str) -> int:
    st = registry.get(coll)
    version = args.version or (st.candidates[-1] if st.candidates else None)
    if version is None:
        raise RegistryError("unknown_version", f"{coll!r} has no candidate to promote")
    if version != st.live and version not in st.candidates:
        raise RegistryError("unknown_version", f"{version!r} is not a candidate of {coll!r} (publish it first)")
    _verify(settings, coll_dir, version)
    if args.require_warm:
        deadline = time.monotonic() + args.wait_s
        while len(warm := registry.warm_replicas(coll, version)) < args.require_warm:
            refused = {r: rep["refused"][version] for r, rep in registry.replicas(coll).items()
                       if version in (rep.get("refused") or {})}
            if refused:
                print(f"error: replicas refused {version}: {refused} (see their logs)", file=sys.stderr)
                return 2
            if time.monotonic() > deadline:
                print(f"error: only {len(warm)} replica(s) report {version} warm ({warm}) after {args.wait_s} s; "
                      f"need {args.require_warm}", file=sys.stderr)
                return 2
            time.sleep(0.2)
    promoted, gate, st = promote_with_gate(settings, registry, coll, version, actor, skip_gate=args.skip_gate)
    if not promoted:
        print(f"error: promotion refused: {gate['reason']}", file=sys.stderr)
        print(json.dumps({"gate": gate}))
        return 2
    print(json.dumps({"promoted": version, "state": st.as_dict(), "gate": gate}))
    return 0


def promote_with_gate(settings, registry: Registry, coll: str, version: str, actor: str, *,
                      skip_gate: bool = False) -> tuple[bool, dict | None, object]:
    """Promote a published candidate through the collection's quality gate (when one is configured and a
    different version is live); a refusal is recorded in the history.  Returns (promoted, gate report or None,
    the registry state)."""
    st = registry.get(coll)
    coll_dir = Path(settings.index_root) / coll
    gate = {"skipped": True} if skip_gate else None
    if not skip_gate and st.live is not None and st.live != version:
        gate = _gate(settings, coll_dir, st.live, version)
        if gate is not None and not gate["passed"]:
            registry.record(coll, {"action": "refuse", "version": version, "reason": gate["reason"], "gate": gate},
                            actor=actor)
            return False, gate, st
    return True, gate, registry.promote(coll, version, gate=gate, actor=actor)


def _gate(settings, coll_dir: Path, live: str, candidate: str) -> dict | None:
    if load_gate_config(coll_dir) is None:
        return None
    encoder = OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)
    return run_gate(coll_dir, IndexVersion.load(coll_dir / live), IndexVersion.load(coll_dir / candidate), encoder)
