"""One experiment under two versions of the code, alternated in one session.

A figure measured on another day, machine load or version says little about what a
change did: these machines are shared and their speed drifts. This runs an experiment
(any ``python -m experiments.X`` that writes ``summary.json`` into ``--out``) under a
base commit and under the working tree, in turn (base, current, base, current, ...),
and compares the figures round by round.

    python -m experiments.code_versions --base 7f63df9 --rounds 3 \\
        --out docs/results/failover_vectorized_versions -- failover --vectorized

The base runs from a ``git worktree`` of that commit in a temporary folder (removed at
the end), so both versions import their own code (the Spark executors get the
driver's ``sys.path``). Writes ``runs.csv`` (every run's summary figures) and
``summary.json`` (per figure: each version's median, min and max, and the median of the
per-round ratios current / base) into ``--out``; each run's own outputs are kept
under ``--out/<version>/<round>``.
"""
from __future__ import annotations

import argparse
import csv
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[1]


def worktree(rev: str, parent: str) -> pathlib.Path:
    """A checkout of ``rev`` in a folder of its own (``git worktree``)."""
    path = pathlib.Path(parent) / f"base-{rev}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev],
                   check=True, capture_output=True)
    return path


def run_one(tree: pathlib.Path, experiment: List[str], out: pathlib.Path,
            timeout: float) -> Dict:
    """``python -m experiments.<experiment>`` in ``tree``, its outputs in ``out``; its
    summary, with the run's exit code."""
    out.mkdir(parents=True, exist_ok=True)
    module, *args = experiment
    with open(out / "log.txt", "w") as log:
        code = subprocess.run([sys.executable, "-m", f"experiments.{module}", *args,
                               "--out", str(out)], cwd=tree, stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout).returncode
    found = out / "summary.json"
    summary = json.loads(found.read_text()) if found.exists() else {}
    return {"exit_code": code, **summary}


def numeric(summary: Dict) -> Dict[str, float]:
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def compare(runs: List[Dict]) -> Dict:
    """Per figure: each version's median (min-max) and the median per-round ratio."""
    figures = sorted({k for r in runs for k in numeric(r["summary"])})
    out: Dict = {}
    for name in figures:
        entry: Dict = {}
        for version in ("base", "current"):
            values = [numeric(r["summary"]).get(name) for r in runs if r["version"] == version]
            values = [v for v in values if v is not None]
            if values:
                entry[version] = {"median": statistics.median(values), "min": min(values),
                                  "max": max(values), "runs": len(values)}
        ratios = []
        for rnd in sorted({r["round"] for r in runs}):
            pair = {r["version"]: numeric(r["summary"]).get(name) for r in runs
                    if r["round"] == rnd}
            if pair.get("base") and pair.get("current") is not None:
                ratios.append(pair["current"] / pair["base"])
        if ratios:
            entry["current_over_base"] = {"median": statistics.median(ratios),
                                          "min": min(ratios), "max": max(ratios)}
        out[name] = entry
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--out", required=True)
    ap.add_argument("experiment", nargs="+",
                    help="after --: the experiment's module under experiments/ and its "
                         "arguments (not --out)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    temp = tempfile.mkdtemp(prefix="flux-versions-")
    runs: List[Dict] = []
    base = None
    try:
        base = worktree(args.base, temp)
        trees = {"base": base, "current": ROOT}
        for rnd in range(1, args.rounds + 1):
            for version, tree in trees.items():
                print(f"round {rnd}: {version} ...", flush=True)
                summary = run_one(tree, args.experiment, (out / version / str(rnd)).resolve(),
                                  args.timeout)
                runs.append({"round": rnd, "version": version, "summary": summary})
    finally:
        if base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base)], capture_output=True)
        shutil.rmtree(temp, ignore_errors=True)
    figures = sorted({k for r in runs for k in r["summary"]})
    with open(out / "runs.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "version"] + figures)
        for r in runs:
            writer.writerow([r["round"], r["version"]] + [r["summary"].get(k) for k in figures])
    summary = {"base": args.base, "current": _head(), "experiment": args.experiment,
               "rounds": args.rounds, "figures": compare(runs)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name, entry in summary["figures"].items():
        cells = [f"{v}: {entry[v]['median']:.4g} ({entry[v]['min']:.4g}-{entry[v]['max']:.4g})"
                 for v in ("base", "current") if v in entry]
        if "current_over_base" in entry:
            cells.append(f"ratio {entry['current_over_base']['median']:.3g}")
        print(f"{name:28s} " + "; ".join(cells))
    print(f"wrote {out}/runs.csv, summary.json")
    return 0


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
