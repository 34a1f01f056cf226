"""python -m experiments.mttf: how long until data is lost, as the cluster grows (paper 4.2).

A job loses data when both replicas of some partition are down at once.

- Cluster pairs (N/2 machines per replica set): any machine lost takes its
  set down until the set is rebuilt (MTTR_c); a loss in the other set
  meanwhile is fatal. The paper: MTTF = 4 MTTF_s^2 / (N^2 MTTR_c).
- Flux with partition pairs: only the two machines holding one partition
  matter. The paper (pairs of machines): MTTF = 2 MTTF_s^2 / (N MTTR_s).
  With chained declustering each machine shares a partition with both its
  neighbours, so a loss of either neighbour within MTTR_s is fatal.

The paper's formulas come from the process-pair approximation
MTTF_s^2 / MTTR_s; counting the failure rate to first order gives the same
shape with other constants (the ``first-order`` columns):
cluster pairs 2 MTTF_s^2 / (N^2 MTTR_c), machine pairs MTTF_s^2 / (N MTTR_s),
chained declustering MTTF_s^2 / (2 N MTTR_s). A Monte-Carlo simulation
(exponential failures, fixed repair time) checks them at a compressed ratio
MTTF_s / MTTR (``--mc-ratio``; the real ratio needs too many events).

MTTR_s is read from the failover experiment's summary (kill to catch-up done)
or given with ``--mttr``. Writes results/mttf/mttf.csv, summary.json, mttf.png.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import random
from typing import Dict, List

KINDS = ("cluster-pairs", "flux-machine-pairs", "flux-chained")


def paper(kind: str, n: int, mttf_s: float, mttr_s: float, mttr_c: float) -> float:
    if kind == "cluster-pairs":
        return 4 * mttf_s ** 2 / (n ** 2 * mttr_c)
    return 2 * mttf_s ** 2 / (n * mttr_s)  # the paper's Flux formula (pairs of machines)


def first_order(kind: str, n: int, mttf_s: float, mttr_s: float, mttr_c: float) -> float:
    if kind == "cluster-pairs":
        return 2 * mttf_s ** 2 / (n ** 2 * mttr_c)
    if kind == "flux-machine-pairs":
        return mttf_s ** 2 / (n * mttr_s)
    return mttf_s ** 2 / (2 * n * mttr_s)


def time_to_loss(kind: str, n: int, mttf_s: float, mttr: float, rng: random.Random) -> float:
    """One run: machines fail at exponential times; returns when a partition is lost."""
    down_until = [0.0] * n
    half, t = n // 2, 0.0
    while True:
        t += rng.expovariate(n / mttf_s)
        k = rng.randrange(n)
        if down_until[k] > t:
            continue  # already down (or its set is being rebuilt)
        if kind == "cluster-pairs":
            other = range(half, n) if k < half else range(half)
            if any(down_until[j] > t for j in other):
                return t
            for j in (range(half) if k < half else range(half, n)):
                down_until[j] = t + mttr  # the whole set is down until it is rebuilt
        else:
            partners = [k ^ 1] if kind == "flux-machine-pairs" else [(k - 1) % n, (k + 1) % n]
            if any(down_until[j] > t for j in partners):
                return t
            down_until[k] = t + mttr


def monte_carlo(kind: str, n: int, ratio: float, runs: int, rng: random.Random) -> float:
    """Mean time to loss in units of MTTF_s, for MTTF_s / MTTR = ``ratio``."""
    return sum(time_to_loss(kind, n, 1.0, 1.0 / ratio, rng) for _ in range(runs)) / runs


def read_mttr(path: pathlib.Path) -> float:
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run experiments.failover first or give --mttr")
    summary = json.loads(path.read_text())
    value = summary.get("catchup_after_kill_s")
    if value is None:
        raise SystemExit(f"{path} has no catchup_after_kill_s: run experiments.failover first "
                         "or give --mttr")
    return float(value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.mttf",
                                 description="MTTF of cluster pairs vs Flux as N grows.")
    ap.add_argument("--mttr", type=float, default=None,
                    help="seconds to recover one machine (default: from the failover summary)")
    ap.add_argument("--failover-summary", default="results/failover/summary.json")
    ap.add_argument("--mttf-days", type=float, default=30.0, help="MTTF of one machine")
    ap.add_argument("--cluster-mttr-factor", type=float, default=1.0,
                    help="MTTR_c / MTTR_s: 1 (most favourable to cluster pairs) to N (paper)")
    ap.add_argument("--nodes", default="4,8,16,32,64", help="comma-separated even N")
    ap.add_argument("--mc-ratio", type=float, default=500.0, help="MTTF_s / MTTR in the simulation")
    ap.add_argument("--runs", type=int, default=300, help="Monte-Carlo runs per point")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/mttf")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    if any(n < 2 or n % 2 for n in sizes):
        ap.error("--nodes must be even numbers >= 2")
    if args.mttf_days <= 0 or args.cluster_mttr_factor < 1 or args.mc_ratio <= 1 or args.runs < 1:
        ap.error("need --mttf-days > 0, --cluster-mttr-factor >= 1, --mc-ratio > 1, --runs >= 1")
    source = "--mttr"
    if args.mttr is None:
        args.mttr = read_mttr(pathlib.Path(args.failover_summary))
        source = args.failover_summary
    if args.mttr <= 0:
        ap.error("--mttr must be > 0")
    mttf_s = args.mttf_days * 86400
    rng = random.Random(args.seed)
    rows: List[Dict[str, float]] = []
    for n in sizes:
        for kind in KINDS:
            mttr_c = args.mttr * args.cluster_mttr_factor
            ratio_c = args.mc_ratio / (args.cluster_mttr_factor if kind == "cluster-pairs" else 1)
            mc = monte_carlo(kind, n, ratio_c, args.runs, rng)
            mc_formula = first_order(kind, n, 1.0, 1.0 / ratio_c, 1.0 / ratio_c)
            rows.append({
                "nodes": n, "kind": kind,
                "paper_years": paper(kind, n, mttf_s, args.mttr, mttr_c) / 31_557_600,
                "first_order_years": first_order(kind, n, mttf_s, args.mttr, mttr_c) / 31_557_600,
                "mc_mttf_over_mttf_s": mc, "first_order_mttf_over_mttf_s": mc_formula,
            })
            print(f"N={n:3d} {kind:19s} paper {rows[-1]['paper_years']:.3g} y, first order "
                  f"{rows[-1]['first_order_years']:.3g} y; simulated {mc:.3g} vs "
                  f"{mc_formula:.3g} MTTF_s at ratio {ratio_c:g}", flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "mttf.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {"mttr_s": args.mttr, "mttr_from": source, "mttf_s_days": args.mttf_days,
               "cluster_mttr_factor": args.cluster_mttr_factor, "mc_ratio": args.mc_ratio,
               "runs": args.runs, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(rows, summary, out / "mttf.png")
    print(f"wrote {out}/mttf.csv, summary.json, mttf.png")
    return 0


def plot(rows, summary, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = dict(zip(KINDS, ("tab:red", "tab:green", "tab:blue")))
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        n = [r["nodes"] for r in mine]
        left.plot(n, [r["first_order_years"] for r in mine], "-o", color=colors[kind], label=kind)
        if kind != "flux-chained":
            left.plot(n, [r["paper_years"] for r in mine], ":", color=colors[kind],
                      label=f"{kind} (paper's formula)")
        right.plot(n, [r["first_order_mttf_over_mttf_s"] for r in mine], "-", color=colors[kind],
                   label=f"{kind} first order")
        right.plot(n, [r["mc_mttf_over_mttf_s"] for r in mine], "o", color=colors[kind],
                   label=f"{kind} simulated")
    left.set(xscale="log", yscale="log", xlabel="machines N", ylabel="MTTF (years)",
             title=f"MTTF_s {summary['mttf_s_days']:g} days, MTTR_s {summary['mttr_s']:.2f} s "
                   f"(measured)")
    right.set(xscale="log", yscale="log", xlabel="machines N", ylabel="MTTF / MTTF_s",
              title=f"Monte-Carlo at MTTF_s/MTTR = {summary['mc_ratio']:g}")
    sizes = sorted({r["nodes"] for r in rows})
    for ax in (left, right):
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
