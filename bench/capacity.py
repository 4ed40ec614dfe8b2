"""Capacity reports of BEIR collections, made by the trainer, collected under ``bench/results/capacity/``.

Usage::

    python -m bench.capacity --dataset /work/shared/data/cranfield --rotation pca [--png]
    python -m bench.capacity --summary        # only rebuild the summary table
    python -m trainer build --dataset data/scifact && \
        python -m bench.capacity --from-version var/indexes/scifact/<version> --png   # an existing version

For each ``--dataset`` it runs the real trainer build (``trainer.build.build_index``,
the same code as ``python -m trainer build``) into a temporary home (the
embedding cache and the ONNX encoder come from ``var/``), then copies the
version's capacity report: ``<collection>_<rotation>.json`` (per-query arrays
dropped), ``<collection>_<rotation>.md`` and, with ``--png``, its three plots.
Finally it rewrites ``README.md``, the table over every JSON in the folder.
Collections without a ``train`` split must use ``--rotation pca`` or ``identity``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import shutil
import sys
import tempfile
from pathlib import Path

from bench.common import ROOT, write_results
from engine.encoder import OnnxEncoder
from engine.io import atomic
from engine.version.manifest import verify
from trainer.build import BuildOptions, build_index
from trainer.capacity_report import PLOTS, render_markdown
from trainer.config import TrainerSettings

OUT = ROOT / "bench" / "results" / "capacity"


def run_one(dataset: Path, rotation: str, png: bool, out: Path, command: str, capacity_overrides: dict) -> dict:
    """Build a version of ``dataset`` in a temporary home (capacity report on) and collect its report."""
    var = ROOT / "var"
    with tempfile.TemporaryDirectory(prefix="capacity-") as home:
        settings = TrainerSettings(home=Path(home), encoder_dir=var / "models" / "minilm-onnx",
                                   embedding_cache=var / "cache" / "embeddings.sqlite").resolved()
        encoder = OnnxEncoder(settings.encoder_dir, threads=settings.encoder_threads)
        opts = BuildOptions(dataset=dataset, rotation=rotation, capacity_options=capacity_overrides)
        path, manifest = build_index(opts, settings, encoder)
        return collect_version(path, png, out, command, {
            "machine": f"{platform.machine()}, {platform.python_version()}",
            "encoder": manifest.encoder.model_name or "all-MiniLM-L6-v2"})


def collect_version(version_dir: Path, png: bool, out: Path, command: str, meta: dict | None = None) -> dict:
    """Copy the capacity report of a built version (``python -m trainer build ...``) into ``out``: JSON and
    Markdown (per-query values dropped), and the plots with ``png``; ``meta`` is added to the report's meta."""
    manifest = verify(version_dir)
    report = json.loads((version_dir / "capacity.json").read_text(encoding="utf-8"))
    rotation = manifest.adapter.kind
    name = f"{manifest.collection}_{rotation}"
    report.pop("per_query", None)
    report["meta"] = {**report.get("meta", {}), "index_version": manifest.version, **(meta or {}),
                      "build_seconds_capacity": (manifest.build_seconds or {}).get("capacity report")}
    report["command"] = command
    if png:
        out.mkdir(parents=True, exist_ok=True)
        for p in PLOTS:
            shutil.copy(version_dir / p, out / f"{name}_{p}")
    write_results(out / name, report, render_markdown(report, f"{manifest.collection} ({rotation} rotation)",
                                                      command=command, plots=png, plot_prefix=f"{name}_"))
    return report


def _f(v, d=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{d}f}"


def write_summary(out: Path) -> str:
    rows = []
    for p in sorted(out.glob("*.json")):
        r = json.loads(p.read_text(encoding="utf-8"))
        d, c, f, s = r["density"], r["cus"], r["failure_prediction"], r["scaling"]
        fit = s["fit"]
        base = (r.get("online_cus_baseline") or {}).get("agreement")
        rows.append(f"| [{p.stem}]({p.stem}.md) | {d['documents']:,} | {d['queries']:,} | {d['pairs']:,} | "
                    f"{_f(d['delta'], 3)} | {d['warren_dstar']} | {d['regime']} | {c['r_star']} | "
                    f"{_f(c['labelled'])} | {_f(c['label_free'])} | {_f(f['auc_top1_stability'])} | "
                    f"{_f(f['auc_label_free_at_r_star'])} | {_f(f['auc_full_width_margin_reference'])} | "
                    f"{_f(fit['r2_mean'])} | {_f(fit['b'], 1)} | {_f(fit['c'], 1)} | "
                    f"{s['workload_queries']} | {_f(base)} |")
    cmds = sorted({json.loads(p.read_text(encoding="utf-8")).get("command", "") for p in out.glob("*.json")})
    text = "\n".join([
        "# Capacity reports (issue 4)", "",
        "One row per collection and served rotation; each links its full report (Markdown, with the command that "
        "made it). Encoder all-MiniLM-L6-v2 (ONNX, D = 384); exact prefix-cosine search over the whole corpus on "
        "the version's rotated embeddings (width 384 = frozen encoder); judged queries of the `test` split. "
        "Collections without a train split use the PCA rotation (document second moment); SciFact's served "
        "rotation is the trained adapter and its PCA row is given for comparison; LIMIT-small also with the "
        "identity rotation (plain truncation of the frozen encoder).", "",
        "Columns: δ = |E|/n; d* = Warren's lower bound (Ω constant 1, clamped to [1, min(m, n)]); r* = CUS width "
        "(d* in the moderate regime, else the stage-1 width 64); CUS labelled = Recall@1(r*)/Recall@1(384); "
        "CUS label-free = share of queries whose top-1 at r* equals the top-1 at 384; AUC stab. = failure AUC "
        "(Recall@1 = 0 at 384) of the continuous label-free CUS (top-1 stability over widths 8..256); AUC r* = "
        "of the binary label-free CUS at r*; AUC margin = of the full-width top-1 − top-2 score margin (a "
        "reference signal, not CUS); R²_mean, b, c = Eq. (24)–(25) of 001 fitted on q90[M_first] over "
        "positive-preserving subsamples (3 per size) at N ∈ n·{1/16..1} and k ∈ {1, 3, 10, 30} with k ≤ N/4; "
        "workload = queries whose relevant document is the full-width top-1; baseline = offline top-1 agreement "
        "of the served `auto` policy (only versions with a router).", "",
        "| report | n | m | \\|E\\| | δ | d* | regime | r* | CUS lab. | CUS free | AUC stab. | AUC r* | "
        "AUC margin | R²_mean | b | c | workload | online baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        "Paper claims for comparison: failure AUC > 0.8 (000 §5.5); R²_mean 0.905–0.973 with b > 0 and c < 0 "
        "(001 §5.1).", "",
        "Commands:", "", *[f"- `{c}`" for c in cmds if c], "",
    ])
    atomic.write_text(out / "README.md", text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", type=Path, action="append", default=[], help="BEIR folder (repeatable)")
    ap.add_argument("--rotation", default="pca", choices=["adapter", "adapter_on_pca", "pca", "identity"])
    ap.add_argument("--png", action="store_true", help="also copy the three PNG plots")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--summary", action="store_true", help="only rewrite README.md from the JSON files")
    ap.add_argument("--from-version", type=Path, help="collect the report of a version built by `trainer build`")
    ap.add_argument("--build-command", default="", help="with --from-version: the command that built it")
    args = ap.parse_args(argv)
    if args.from_version:
        cmd = (f"{args.build_command} && " if args.build_command else "") + \
            f"python -m bench.capacity --from-version {args.from_version}" + (" --png" if args.png else "")
        collect_version(args.from_version, args.png, args.out, cmd)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for ds in args.dataset:
        cmd = f"python -m bench.capacity --dataset {ds} --rotation {args.rotation}" + (" --png" if args.png else "")
        rep = run_one(ds, args.rotation, args.png, args.out, cmd, {})
        d, fit = rep["density"], rep["scaling"]["fit"]
        print(f"{ds.name} {args.rotation}: delta={d['delta']:.4f} d*={d['warren_dstar']} {d['regime']} "
              f"CUS={rep['cus']['labelled']:.3f}/{rep['cus']['label_free']:.3f} "
              f"AUC={rep['failure_prediction']['auc_top1_stability']:.3f} R2={fit['r2_mean']:.3f} "
              f"b={fit['b']:.2f} c={fit['c']:.2f}", flush=True)
    print(write_summary(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
