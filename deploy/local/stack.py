"""The docker-compose stack as plain processes, for machines without Docker.

``python deploy/local/stack.py up|status|down [--home DIR] [--state DIR]``

``up`` starts, each in its own process group with its log in the state folder:

1. ``redis-server`` on a free port (the version registry and the write-ahead logs; append-only file in the
   state folder, fsync per write);
2. the index: the collection's newest complete version under ``<home>/indexes`` is published and promoted
   in this Redis (``trainer publish`` / ``trainer promote``); with none, ``trainer build`` builds the
   dataset first (about 5 minutes for SciFact on 2 cores, embeddings cached in ``<home>/cache``);
3. the trainer daemon (``python -m trainer serve``), its ``/metrics`` on a free port;
4. two gateways, ``blue`` and ``green`` (``python -m service``), following the Redis registry;
5. Prometheus (Debian's ``prometheus`` binary; ``make promtool`` installs it) with our rules, scraping both
   gateways and the trainer (the scrape config is ``deploy/prometheus/prometheus.yml`` with the targets
   rewritten to the local ports).

It waits until Redis answers, both gateways answer ``/readyz`` 200, the trainer serves ``/metrics`` and
Prometheus is ready, writes ``stack.json`` (pids, ports, URLs) in the state folder and prints it.
``status`` prints each component's health (exit 1 when one is down); ``down`` stops every process it
started (SIGTERM to its process group, SIGKILL after 30 s).  Ports: free ones unless ``--gateway-ports``,
``--trainer-port``, ``--prometheus-port`` or ``--redis-port`` are given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPLICAS = ("blue", "green")

sys.path.insert(0, str(ROOT))
from adawidth_client import Client, NotReadyError, ServerExited  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200, r.read(4096).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return False, repr(e)


def redis_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, reaped or not, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except OSError:
        return True
    if state in ("Z", "X"):
        try:  # our own child: reap it
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


class Stack:
    def __init__(self, home: Path, state: Path, collection: str, dataset: Path):
        self.home, self.state, self.collection, self.dataset = home.resolve(), state.resolve(), collection, dataset.resolve()
        self.file = self.state / "stack.json"

    # ------------------------------------------------------------------ helpers
    def env(self, redis_url: str, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL" and not k.startswith("ADAWIDTH_")}
        env.update(ADAWIDTH_HOME=str(self.home), ADAWIDTH_COLLECTION=self.collection, ADAWIDTH_REDIS_URL=redis_url,
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> dict:
        log = self.state / f"{name}.log"
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        return {"pid": proc.pid, "log": str(log), "argv": argv}

    def trainer(self, redis_url: str, *args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "trainer", *args], cwd=ROOT, env=self.env(redis_url),
                           capture_output=True, text=True, timeout=timeout_s)
        with open(self.state / "trainer-cli.log", "a") as fh:
            fh.write(f"$ trainer {' '.join(args)}\n{r.stdout}{r.stderr}\n")
        if r.returncode != 0:
            raise RuntimeError(f"trainer {' '.join(args)} failed ({r.returncode}): {r.stderr[-2000:]}")
        return r

    def newest_version(self) -> str | None:
        """The newest complete version of the collection whose manifest reads, or None."""
        # imported here: main() puts this checkout first on sys.path before anything of the project is imported
        from engine.version.manifest import IndexVersionError, read_manifest
        from engine.version.store import list_versions

        coll = self.home / "indexes" / self.collection
        good = []
        for v in list_versions(coll):
            try:
                read_manifest(coll / v)
            except IndexVersionError:
                continue
            good.append(v)
        return max(good) if good else None

    def prometheus_config(self, gateways: list[int], trainer_port: int, scrape_s: float) -> Path:
        import yaml

        cfg = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = f"{scrape_s:g}s"
        cfg["rule_files"] = [str(ROOT / "deploy" / "prometheus" / r) for r in cfg["rule_files"]]
        for job in cfg["scrape_configs"]:
            job.pop("scrape_interval", None)
            if job["job_name"] == "adawidth-gateway":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{p}"], "labels": {"tier": "gateway", "replica": name}}
                                         for name, p in zip(REPLICAS, gateways)]
            elif job["job_name"] == "adawidth-trainer":
                job["static_configs"] = [{"targets": [f"127.0.0.1:{trainer_port}"], "labels": {"tier": "trainer"}}]
        path = self.state / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    # ------------------------------------------------------------------ commands
    def up(self, args) -> dict:
        if self.file.exists() and any(alive(c["pid"]) for c in json.loads(self.file.read_text())["components"].values()):
            raise RuntimeError(f"a stack is already running from {self.state} (run `down` first)")
        for exe in ("redis-server", "prometheus"):
            if shutil.which(exe) is None:
                raise RuntimeError(f"{exe} is not installed (apt-get install redis-server prometheus; "
                                   "`make promtool` installs prometheus)")
        self.state.mkdir(parents=True, exist_ok=True)
        ports = {"redis": args.redis_port or free_port(), "trainer": args.trainer_port or free_port(),
                 "prometheus": args.prometheus_port or free_port()}
        gw_ports = args.gateway_ports or [free_port() for _ in REPLICAS]
        comps: dict[str, dict] = {}
        info = {"state": str(self.state), "home": str(self.home), "collection": self.collection, "components": comps}

        def save():
            self.file.write_text(json.dumps(info, indent=1))

        try:
            # a fresh registry each time: the versions live on disk, `up` promotes the newest one
            shutil.rmtree(self.state / "redis", ignore_errors=True)
            (self.state / "redis").mkdir()
            comps["redis"] = self.spawn("redis", [shutil.which("redis-server"), "--port", str(ports["redis"]), "--bind",
                                                  "127.0.0.1", "--dir", str(self.state / "redis"), "--appendonly", "yes",
                                                  "--appendfsync", "always", "--save", "", "--protected-mode", "no"])
            comps["redis"].update(port=ports["redis"], url=f"redis://127.0.0.1:{ports['redis']}/0")
            save()
            self.wait(lambda: redis_ok(ports["redis"]), "redis", 30)
            redis_url = comps["redis"]["url"]

            version = self.newest_version()
            if version is None or args.build:
                self.trainer(redis_url, "build", "--dataset", str(self.dataset), "--collection", self.collection,
                             "--promote")
                version = self.newest_version()
            else:
                self.trainer(redis_url, "publish", self.collection, version)
                self.trainer(redis_url, "promote", self.collection, version)
            info["index_version"] = version

            comps["trainer"] = self.spawn("trainer", [sys.executable, "-m", "trainer", "serve", "--dataset",
                                                      str(self.dataset), "--collection", self.collection, "--host",
                                                      "127.0.0.1", "--port", str(ports["trainer"]), "--poll-seconds",
                                                      str(args.poll_seconds)], self.env(redis_url))
            comps["trainer"].update(port=ports["trainer"], url=f"http://127.0.0.1:{ports['trainer']}")
            for name, port in zip(REPLICAS, gw_ports):
                comps[f"gateway-{name}"] = self.spawn(
                    f"gateway-{name}", [sys.executable, "-m", "service"],
                    self.env(redis_url, ADAWIDTH_PORT=port, ADAWIDTH_REPLICA_ID=f"gateway-{name}",
                             ADAWIDTH_ENCODER_THREADS=1, ADAWIDTH_REGISTRY_POLL_S=1))
                comps[f"gateway-{name}"].update(port=port, url=f"http://127.0.0.1:{port}")
            config = self.prometheus_config(gw_ports, ports["trainer"], args.scrape_seconds)
            comps["prometheus"] = self.spawn("prometheus", [
                shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.state / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}", "--storage.tsdb.retention.time=1d"])
            comps["prometheus"].update(port=ports["prometheus"], url=f"http://127.0.0.1:{ports['prometheus']}")
            save()
            deadline = time.monotonic() + args.timeout
            for name, c in comps.items():
                remaining = max(1.0, deadline - time.monotonic())
                if name.startswith("gateway-"):
                    self.wait_gateway(name, c, remaining)
                else:
                    self.wait(lambda c=c, n=name: self.healthy(n, c)[0], name, remaining, c)
        except BaseException:
            save()
            self.down()
            raise
        save()
        return info

    def healthy(self, name: str, c: dict) -> tuple[bool, str]:
        if not alive(c["pid"]):
            return False, "process exited"
        if name == "redis":
            return redis_ok(c["port"]), "PING"
        if name.startswith("gateway-"):
            with Client(c["url"]) as client:
                body = client.ready()
            return body is not None, json.dumps(body) if body is not None else "not ready"
        if name == "trainer":
            ok, body = http_ok(c["url"] + "/metrics")
            return ok, "metrics" if ok else body
        if name == "prometheus":
            return http_ok(c["url"] + "/-/ready")
        return True, ""

    def wait_gateway(self, name: str, comp: dict, timeout_s: float) -> None:
        """The client's readiness wait on a gateway's ``/readyz``; stops at once if its process exits."""
        with Client(comp["url"]) as client:
            try:
                client.wait_ready(timeout_s, poll_s=0.3, alive=lambda: alive(comp["pid"]))
            except ServerExited:
                raise RuntimeError(f"{name} exited: {Path(comp['log']).read_text(errors='replace')[-3000:]}") from None
            except NotReadyError as e:
                raise TimeoutError(f"{name} not healthy after {timeout_s:.0f} s ({e.last}) "
                                   f"{Path(comp['log']).read_text(errors='replace')[-3000:]}") from None

    def wait(self, check, name: str, timeout_s: float, comp: dict | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if comp is not None and not alive(comp["pid"]):
                raise RuntimeError(f"{name} exited: {Path(comp['log']).read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                tail = Path(comp["log"]).read_text(errors="replace")[-3000:] if comp else ""
                raise TimeoutError(f"{name} not healthy after {timeout_s:.0f} s {tail}")
            time.sleep(0.3)

    def status(self) -> dict:
        if not self.file.exists():
            return {"running": False, "components": {}}
        info = json.loads(self.file.read_text())
        out = {}
        for name, c in info["components"].items():
            ok, detail = self.healthy(name, c)
            out[name] = {"pid": c["pid"], "url": c.get("url"), "healthy": ok,
                         "detail": detail if not ok or name.startswith("gateway") else ""}
        return {"running": True, "state": info["state"], "index_version": info.get("index_version"), "components": out}

    def down(self, grace_s: float = 30.0) -> list[str]:
        if not self.file.exists():
            return []
        comps = json.loads(self.file.read_text())["components"]
        stopped = []
        # gateways and Prometheus first, Redis last (replicas report to it while they stop)
        order = sorted(comps, key=lambda n: {"prometheus": 0, "trainer": 2, "redis": 3}.get(n, 1))
        for name in order:
            pid = comps[name]["pid"]
            if alive(pid):
                try:
                    os.killpg(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                deadline = time.monotonic() + grace_s
                while alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if alive(pid):
                    os.killpg(pid, signal.SIGKILL)
                stopped.append(name)
        self.file.unlink()
        return stopped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "status", "down"])
    p.add_argument("--home", type=Path, default=Path(os.environ.get("ADAWIDTH_HOME", ROOT / "var")))
    p.add_argument("--state", type=Path, help="state folder (default <home>/local-stack)")
    p.add_argument("--collection", default="scifact")
    p.add_argument("--dataset", type=Path, default=ROOT / "data" / "scifact")
    p.add_argument("--build", action="store_true", help="build a new version even when one exists")
    p.add_argument("--gateway-ports", type=int, nargs=2)
    p.add_argument("--trainer-port", type=int)
    p.add_argument("--prometheus-port", type=int)
    p.add_argument("--redis-port", type=int)
    p.add_argument("--scrape-seconds", type=float, default=15.0, help="Prometheus scrape and rule interval")
    p.add_argument("--poll-seconds", type=float, default=300.0, help="trainer daemon's dataset check interval")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every component to be healthy")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    stack = Stack(args.home, args.state or args.home / "local-stack", args.collection, args.dataset)
    if args.command == "up":
        print(json.dumps(stack.up(args), indent=1))
        return 0
    if args.command == "status":
        st = stack.status()
        print(json.dumps(st, indent=1))
        return 0 if st["running"] and all(c["healthy"] for c in st["components"].values()) else 1
    print(json.dumps({"stopped": stack.down()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
