"""deploy/prometheus with the real promtool: config and rules check, rule unit tests, and metric names that exist.

promtool comes from Debian's ``prometheus`` package (``make test`` installs it when absent).  These tests
fail, never skip, when it is missing.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from service.metrics import GatewayMetrics
from service.online_cus import OnlineCusMonitor
from trainer.serve import TrainerMetrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "rules" / "adawidth.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "adawidth-dashboard.json"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's prometheus package (make test does: apt-get install -y prometheus)"
    return path


def run_promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_and_config_are_valid():
    r = run_promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 10 rules found" in r.stdout
    r = run_promtool("check", "config", str(PROM / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_pass():
    r = run_promtool("test", "rules", "tests/adawidth.rules.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_rule_unit_tests_catch_a_broken_rule(tmp_path):
    """The rule tests are not vacuous: loosening the online-CUS margin makes them fail."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    broken = RULES.read_text().replace("adawidth_online_cus_baseline_ratio) - 0.10)",
                                       "adawidth_online_cus_baseline_ratio) - 0.40)")
    assert broken != RULES.read_text()
    (tmp_path / "rules" / "adawidth.rules.yml").write_text(broken)
    shutil.copy(PROM / "tests" / "adawidth.rules.test.yml", tmp_path / "tests")
    r = run_promtool("test", "rules", "tests/adawidth.rules.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "AdawidthOnlineCusBelowBaseline" in r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_silent_case():
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert len(alerts) == 6
    cases = [(t["alertname"], t["exp_alerts"] or [])
             for g in yaml.safe_load((PROM / "tests" / "adawidth.rules.test.yml").read_text())["tests"]
             for t in g.get("alert_rule_test", [])]
    for a in alerts:
        assert any(name == a and not exp for name, exp in cases), f"{a} has no silent case"
        assert any(name == a and exp for name, exp in cases), f"{a} has no firing case"


def exported_metric_names() -> set[str]:
    reg = CollectorRegistry()
    GatewayMetrics(reg)
    OnlineCusMonitor(reg, start=False)
    TrainerMetrics(reg)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
                "info": ("_info",)}
    return {fam.name + suf for fam in reg.collect() for suf in suffixes.get(fam.type, ("",))}


def test_rules_and_dashboard_use_only_exported_metrics():
    names = exported_metric_names() | {"up"}
    recorded = set(re.findall(r"record: ([\w:]+)", RULES.read_text()))
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    used = set()
    for text in [RULES.read_text(), *exprs]:
        used |= set(re.findall(r"\b(adawidth_[a-z0-9_]+)\b", text))
    assert used, "no adawidth metric referenced"
    missing = used - names - recorded
    assert not missing, f"metrics referenced but never exported: {sorted(missing)}"
    for want in ("adawidth_online_cus_samples_total", "adawidth_online_cus_agreements_total",
                 "adawidth_capacity_cus_labelled_ratio", "adawidth_live_version_info"):
        assert want in used
