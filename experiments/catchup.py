"""Catch-up with state of real size: N MB per partition, one node killed.

For each N (1, 8.5, 50 and 100 MB by default) the failover experiment runs the
paper's dataflow with ``Ballast(N)`` in its first stage (N MB of keyed state
per partition, about 83 bytes a key, every record rewriting one) on an
embedded local-cluster, at a modest steady rate, and kills one node. Per N it
records: time to full redundancy (kill to catch-up done), the longest wait
between two outputs (the recovering partition's pause holds the ordered
output back), the pause itself (the active's sources paused to resumed:
phase 2 of the movement, the delta), detection and take-over, bytes moved and the rate of the
movement (bytes over the time from both StateMovers ready to the state
installed, which includes the pause and drain of the sources), and false
detections (live processes declared dead: must be none). The paper moved
8.5 MB in 941 ms, all of it a stall (section 5.4).

    python -m experiments.catchup                      # 1, 8.5, 50, 100 MB
    python -m experiments.catchup --mb 1 8.5 --rate 2000

Writes ``results/catchup/summary.json``, ``table.md`` and ``catchup.png``, and
each run's failover outputs under ``results/catchup/<N>mb/``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
from typing import Any, Dict, List

from experiments import failover

DEFAULT_MB = (1.0, 8.5, 50.0, 100.0)
#: the paper's figure for 8.5 MB (5.4): movement time, all of it a stall
PAPER_8_5_MB_S = 0.941


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.catchup",
                                 description="Kill a node with N MB of state per partition.")
    ap.add_argument("--mb", type=float, nargs="+", default=list(DEFAULT_MB))
    ap.add_argument("--rate", type=float, default=2000.0, help="input packets per second")
    ap.add_argument("--duration", type=float, default=24.0, help="seconds of input per run")
    ap.add_argument("--kill-at", type=float, default=8.0)
    ap.add_argument("--out", default="results/catchup")
    args = ap.parse_args(argv)
    if any(mb <= 0 for mb in args.mb):
        ap.error("--mb values must be > 0")
    return args


def row(mb: float, s: Dict[str, Any]) -> Dict[str, Any]:
    moved, seconds = s["state_bytes_moved"], s["state_move_s"]
    return {
        "state_mb_per_partition": mb,
        "output_matches_reference": s["output_matches_reference"],
        "dropped_inputs": s["dropped_inputs"],
        "false_detections": len(s["false_detections"]),
        "detect_after_kill_s": s["detect_after_kill_s"],
        "takeover_after_kill_s": s["takeover_after_kill_s"],
        "redundancy_after_kill_s": s["catchup_after_kill_s"],
        "max_output_gap_s": s["max_output_gap_s"],
        "pause_s": s["max_catchup_pause_s"],
        "state_mb_moved": round(moved / 1e6, 2),
        "movement_s": seconds,
        "movement_mb_per_s": round(moved / 1e6 / seconds, 1) if seconds else None,
        "median_interval_latency_ms": s["median_interval_latency_ms"],
        "stuck_reports": len(s["stuck_reports"]),
    }


COLUMNS = [("state_mb_per_partition", "MB / partition"), ("redundancy_after_kill_s", "kill to redundancy (s)"),
           ("max_output_gap_s", "longest output gap (s)"), ("pause_s", "pause (s)"),
           ("detect_after_kill_s", "detection (s)"),
           ("state_mb_moved", "MB moved"), ("movement_s", "movement (s)"),
           ("movement_mb_per_s", "MB/s"), ("false_detections", "false detections"),
           ("dropped_inputs", "dropped"), ("output_matches_reference", "output = reference")]


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: List[Dict[str, Any]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = [r["state_mb_per_partition"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(mb, [r["redundancy_after_kill_s"] for r in rows], "o-", label="kill to redundancy")
    ax.plot(mb, [r["max_output_gap_s"] for r in rows], "s-", label="longest output gap")
    if all(r["pause_s"] is not None for r in rows):
        ax.plot(mb, [r["pause_s"] for r in rows], "^-", label="pause of the recovering partition")
    ax.plot([8.5], [PAPER_8_5_MB_S], "r*", ms=12, label="paper: 8.5 MB moved in 941 ms (a stall)")
    ax.set_xlabel("state per partition (MB)")
    ax.set_ylabel("seconds")
    ax.set_title("Catch-up with state of real size (one node killed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    rows = []
    for mb in args.mb:
        print(f"== {mb} MB per partition", flush=True)
        run_args = failover.parse_args([
            "--duration", str(args.duration), "--kill-at", str(args.kill_at),
            "--rate", str(args.rate), "--state-mb", str(mb), "--out", str(out / f"{mb:g}mb")])
        rows.append(row(mb, failover.run(run_args)))
        print(table(rows[-1:]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "table.md").write_text(table(rows))
    plot(rows, out / "catchup.png")
    print(table(rows))
    print(f"wrote {out}/summary.json, table.md, catchup.png")
    ok = all(r["output_matches_reference"] and not r["false_detections"] and not r["dropped_inputs"]
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
