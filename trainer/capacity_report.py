"""The capacity report of an index version as files: JSON, Markdown and PNG plots (matplotlib).

The maths is :func:`adawidth.capacity.capacity_report`; this module only turns
its dict into files and a manifest summary.  Files of a version (all covered by
the manifest's checksums):

======================  ==========================================================
capacity.json           the full report, per-query values included
capacity.md             the human-readable report with the plots linked
capacity_cliff.png      Recall@100 and NDCG@10 against width (all / easiest / hardest decile)
capacity_cus.png        labelled and label-free CUS and the failure AUC against width
capacity_scaling.png    q90[M_first] against N per k with the fitted Eq. (24) of 001
======================  ==========================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

PLOTS = ("capacity_cliff.png", "capacity_cus.png", "capacity_scaling.png")


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, float) and math.isnan(v):
        return "n/a"
    return f"{v:.{digits}f}"


def summary(report: dict) -> dict:
    """The manifest's ``capacity`` entry: every headline number, no per-query arrays."""
    d, c, f, s = report["density"], report["cus"], report["failure_prediction"], report["scaling"]
    out = {
        "delta": d["delta"], "pairs": d["pairs"], "documents": d["documents"], "queries": d["queries"],
        "warren_dstar": d["warren_dstar"], "regime": d["regime"], "caveats": report["caveats"],
        "r_star": c["r_star"], "r_rule": c["r_rule"], "cus_labelled": c["labelled"], "cus_label_free": c["label_free"],
        "top1_stability_mean": c["top1_stability_mean"],
        "failure_auc_top1_stability": f["auc_top1_stability"],
        "failure_auc_label_free_at_r_star": f["auc_label_free_at_r_star"],
        "failure_auc_margin_reference": f["auc_full_width_margin_reference"],
        "failures": f["failures"],
        "cliff": {k: report["cliff"][k] for k in ("widths", "recall@100", "ndcg@10", "width_95pct_ndcg@10")},
        "cus_by_width": c["by_width"],
        "scaling_fit": s["fit"], "scaling_workload_queries": s["workload_queries"],
        "search": report["search"],
    }
    if "online_cus_baseline" in report:
        out["online_cus_baseline"] = report["online_cus_baseline"]
    return out


def render_markdown(report: dict, title: str, command: str | None = None, plots: bool = True,
                    plot_prefix: str = "") -> str:
    """Markdown of a report (``plot_prefix`` is prepended to the PNG file names in links)."""
    d, c, f, s, cl = (report["density"], report["cus"], report["failure_prediction"], report["scaling"],
                      report["cliff"])
    lines = [f"# Capacity report: {title}", ""]
    meta = report.get("meta", {})
    if meta:
        lines += [" · ".join(f"{k}: `{v}`" for k, v in meta.items()), ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["## Density regime (000 §2, §6)", "",
              "| |E| judged pairs | n documents | m queries | δ = |E|/n | Warren d* | regime |",
              "|---|---|---|---|---|---|---|",
              f"| {d['pairs']:,} | {d['documents']:,} | {d['queries']:,} | {_fmt(d['delta'], 4)} | "
              f"{d['warren_dstar']} | **{d['regime']}** |", "",
              "Caveats:", ""] + [f"- {x}" for x in report["caveats"]] + [""]
    lines += ["## Capacity Utilization Score (Definition 2.2 of 000)", "",
              f"r* = {c['r_star']} ({c['r_rule']}).", "",
              "| CUS labelled at r* | CUS label-free at r* | mean top-1 stability | Recall@1 at r* | Recall@1 full |",
              "|---|---|---|---|---|",
              f"| {_fmt(c['labelled'])} | {_fmt(c['label_free'])} | {_fmt(c['top1_stability_mean'])} | "
              f"{_fmt(c['recall@1_at_r'])} | {_fmt(c['recall@1_full'])} |", ""]
    bw = c["by_width"]
    lines += ["| width | " + " | ".join(str(w) for w in bw["widths"]) + " |",
              "|---|" + "---|" * len(bw["widths"]),
              "| CUS labelled | " + " | ".join(_fmt(v) for v in bw["labelled"]) + " |",
              "| CUS label-free | " + " | ".join(_fmt(v) for v in bw["label_free"]) + " |",
              "| failure AUC of agreement | " + " | ".join(_fmt(v) for v in bw["failure_auc_of_agreement"]) + " |",
              ""]
    if "online_cus_baseline" in report:
        ob = report["online_cus_baseline"]
        lines += [f"Online CUS baseline (served policy `{ob['policy']}` top-1 = full-width top-1): "
                  f"**{_fmt(ob['agreement'])}** over {ob['queries']} queries.", ""]
    lines += ["## Failure prediction (000 §5.5)", "",
              f"Failure: {f['label']}; {f['failures']} of {f['queries']} queries.", "",
              "| score | AUC |", "|---|---|",
              f"| continuous label-free CUS (top-1 stability) | **{_fmt(f['auc_top1_stability'])}** |",
              f"| binary label-free CUS at r* | {_fmt(f['auc_label_free_at_r_star'])} |",
              f"| reference (not CUS): full-width top-1 − top-2 margin | {_fmt(f['auc_full_width_margin_reference'])} |",
              "", "000 claims AUC > 0.8 (product search, LIMIT).", ""]
    lines += ["## Dimension cliff (000 §3)", "",
              f"Difficulty deciles ({cl['queries_per_decile']} queries each) are {cl['difficulty']}. "
              f"Smallest width reaching 95% of full-width NDCG@10: {cl['width_95pct_ndcg@10']}."
              + (" Recall@100 is trivially 1 here (n <= 100)." if cl.get("recall@100_trivial") else ""), "",
              "| width | " + " | ".join(str(w) for w in cl["widths"]) + " |",
              "|---|" + "---|" * len(cl["widths"])]
    for metric in ("recall@100", "ndcg@10"):
        for part in ("all", "easiest_decile", "hardest_decile"):
            lines.append(f"| {metric} {part.replace('_', ' ')} | "
                         + " | ".join(_fmt(v) for v in cl[metric][part]) + " |")
    lines.append("")
    fit = s["fit"]
    lines += ["## Prefix sufficiency (001 §4, §5.1)", "",
              f"Workload: {s['workload_queries']} {s['workload']}. {s['subsampling']}; "
              f"{s['replicates']} subsamples per size; q{int(round(s['quantile'] * 100))} of M_first over the "
              f"workload; width grid of {s['width_grid']['count']} widths from {s['width_grid']['min']} to "
              f"{s['width_grid']['max']}.", ""]
    if s.get("skipped"):
        lines += [f"Not fitted: {s['skipped']}.", ""]
    else:
        lines += [f"OLS fit of Eq. (24): q90 = {_fmt(fit['a'], 1)} + {_fmt(fit['b'], 2)} ln N "
                  f"{'+' if fit['c'] >= 0 else '−'} {_fmt(abs(fit['c']), 2)} ln k; "
                  f"**R²_mean = {_fmt(fit['r2_mean'])}** (Eq. 25) over {fit['settings']} settings; "
                  f"b > 0: {_fmt(fit['b_positive'])}, c < 0: {_fmt(fit['c_negative'])} "
                  "(001 reports R²_mean 0.905–0.973, b > 0, c < 0).", "",
                  "| N | k | q90 mean | q90 per subsample | median M_first |", "|---|---|---|---|---|"]
        for p in s["points"]:
            lines.append(f"| {p['N']:,} | {p['k']} | {_fmt(p['q90_mean'], 1)} | "
                         f"{', '.join(_fmt(v, 0) for v in p['q90_replicates'])} | {_fmt(p['median_m_first'], 0)} |")
        lines.append("")
    lines += [f"Search: {report['search']}.", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({plot_prefix}{p})" for p in PLOTS] + [""]
    return "\n".join(lines)


def plot_cliff(report: dict, path: Path) -> None:
    """Recall@100 and NDCG@10 against width, with d* and r* marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cl = report["cliff"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), dpi=80)
    for ax, metric in zip(axes, ("recall@100", "ndcg@10")):
        for part, style in (("all", "k-o"), ("easiest_decile", "g--^"), ("hardest_decile", "r--v")):
            ax.plot(cl["widths"], cl[metric][part], style, ms=3, label=part.replace("_", " "))
        ax.axvline(report["density"]["warren_dstar"], color="tab:blue", lw=0.8, ls=":", label="Warren d*")
        ax.axvline(report["cus"]["r_star"], color="tab:purple", lw=0.8, ls="-.", label="r*")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("width (coordinates)")
        ax.set_ylabel(metric)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("dimension cliff", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_cus(report: dict, path: Path) -> None:
    """Labelled and label-free CUS and the failure AUC of top-1 agreement against width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw = report["cus"]["by_width"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=80)
    ax.plot(bw["widths"], bw["labelled"], "b-o", ms=3, label="CUS labelled")
    ax.plot(bw["widths"], bw["label_free"], "m-s", ms=3, label="CUS label-free (top-1 agreement)")
    ax.plot(bw["widths"], bw["failure_auc_of_agreement"], "k--", lw=1, label="failure AUC of agreement")
    ax.axvline(report["cus"]["r_star"], color="tab:purple", lw=0.8, ls="-.", label="r*")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("width r (coordinates)")
    ax.set_ylim(0, 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_scaling(report: dict, path: Path) -> None:
    """q90[M_first] against N (log scale) for each k, with the fitted surface of Eq. (24) of 001."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["scaling"]
    fig, ax = plt.subplots(figsize=(5.5, 3.4), dpi=80)
    fit = s["fit"]
    for i, k in enumerate(sorted({p["k"] for p in s["points"]})):
        pts = [p for p in s["points"] if p["k"] == k]
        ns = np.array([p["N"] for p in pts], dtype=float)
        col = plt.cm.viridis(i / max(1, len(s["ks"]) - 1))
        for p in pts:
            ax.scatter([p["N"]] * len(p["q90_replicates"]), p["q90_replicates"], s=6, color=col, alpha=0.4)
        ax.plot(ns, [p["q90_mean"] for p in pts], "o", color=col, ms=4, label=f"k={k}")
        if not math.isnan(fit["a"]):
            grid = np.geomspace(ns.min(), ns.max(), 20)
            ax.plot(grid, fit["a"] + fit["b"] * np.log(grid) + fit["c"] * math.log(k), "-", color=col, lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("corpus size N")
    ax.set_ylabel("q90 of M_first (coordinates)")
    title = "prefix sufficiency"
    if not math.isnan(fit.get("r2_mean", float("nan"))):
        title += f": R²_mean = {fit['r2_mean']:.3f}"
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def file_writers(report: dict, title: str) -> dict[str, Callable[[Path], None]]:
    """File name -> writer, for :func:`engine.version.store.write_version` (or any folder)."""
    return {
        "capacity.json": lambda p: p.write_text(json.dumps(report, indent=1, allow_nan=True), encoding="utf-8"),
        "capacity.md": lambda p: p.write_text(render_markdown(report, title), encoding="utf-8"),
        "capacity_cliff.png": lambda p: plot_cliff(report, p),
        "capacity_cus.png": lambda p: plot_cus(report, p),
        "capacity_scaling.png": lambda p: plot_scaling(report, p),
    }
