"""python -m experiments.failover: the paper's failover experiment (section 5.4) on Spark.

The paper's dataflow (session reconstruction by (src, dst), then per-(app, src)
max and average duration, emitted every other update) runs with Flux on an
embedded local-cluster: 4 nodes + 1 standby in chained declustering, plus one
warm spare executor. A feed sends packets at a steady rate; one node is killed
half-way. The run computes the failure-free reference itself and writes

- ``timeline.csv``: per 100 ms, inputs taken and dropped, outputs, output rate
  and average end-to-end latency;
- ``summary.json``: rates, drops, whether the output equals the reference, and
  the times of the kill, its detection, the end of take-over and of catch-up;
- ``failover.png``: output rate and latency over time, like the paper's Figure 8.

With ``--kafka`` the packets come from a Kafka topic of ``--topic-partitions``
partitions (a real Kafka-protocol broker, noida-db, started and stopped by the
run; a producer feeds it at ``--rate``, or fills it before the job with
``--max-rate``) and the output goes to a transactional ``KafkaSink``; the job
checkpoints (the input log keeps the partitions' interleaving), and with
``--double`` both replicas of a partition die, so the job restarts from its
checkpoint. The output read back with ``read_committed`` must equal the
failure-free output of the inputs in the order the job numbered them. With
``--vectorized`` too, the packets are JSON objects read as Arrow batches
(``KafkaSource(schema=PACKET_SCHEMA)``).

Times are seconds since the data started to flow.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import pathlib
import tempfile
import time
from typing import Any, Dict, List, Optional

from tqdm import tqdm

from flux.examples import paper_dataflow, vectorized_dataflow
from flux.testing.dataflows import ballast_paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.connectors.sources import Paced, RateLimited
from controller.topology import node_name
from flux.testing.workloads import packet_workload

#: the paper's workload knobs: 100K (src, dst) pairs, 10 x 1000 = 10K (app, src) values
PAIRS, APPS, SOURCES = 100_000, 10, 1_000
#: how many packets "--max-rate" prepares per second of --duration
MAX_RATE_BUDGET = 60_000


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.failover",
                                 description="Kill a node mid-stream; plot output rate and "
                                             "latency through take-over and catch-up.")
    ap.add_argument("--quick", action="store_true",
                    help="a short run (16 s of data, kill at 8 s): under a minute in all")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--standbys", type=int, default=1)
    ap.add_argument("--duration", type=float, default=None, help="seconds of input (default 40)")
    ap.add_argument("--kill-at", type=float, default=None,
                    help="seconds after the start (default: half the duration); with "
                         "--max-rate, once that share of the inputs came in")
    ap.add_argument("--kill", choices=("worker", "executor", "host", "cut"), default="worker",
                    help="kill the node's Python worker (process crash) or its executor JVM; "
                         "with --hosts also: every process of its host, or cut its host off "
                         "silently (healed once the output is complete)")
    ap.add_argument("--hosts", type=int, default=0,
                    help="run on the multi-host rig (a Spark standalone cluster, a network "
                         "namespace per host; needs root) instead of a local-cluster")
    ap.add_argument("--victim", default="node1")
    ap.add_argument("--rate", type=float, default=20_000.0, help="input packets per second")
    ap.add_argument("--max-rate", action="store_true",
                    help="feed the packets as fast as the dataflow takes them")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--state-mb", type=float, default=0.0,
                    help="extra keyed state per partition (MB, Ballast in the first stage): "
                         "the paper moved 8.5 MB")
    ap.add_argument("--kafka", action="store_true",
                    help="read the packets from a Kafka topic and write the output to one, "
                         "exactly once (a broker is started for the run)")
    ap.add_argument("--topic-partitions", type=int, default=4,
                    help="partitions of the input topic (--kafka)")
    ap.add_argument("--double", action="store_true",
                    help="--kafka: kill both replicas of a partition of the victim (the job "
                         "restarts from its last checkpoint)")
    ap.add_argument("--vectorized", action="store_true",
                    help="the paper's operators on Arrow batches (flux.examples.vectorized); "
                         "the output must still equal the per-record reference")
    ap.add_argument("--item-delay", type=float, default=None,
                    help="seconds an item waits for more inputs (default: the job's)")
    ap.add_argument("--arrow-feed", action="store_true",
                    help="with --vectorized --max-rate: the packets handed over as Arrow "
                         "batches of 1024 rows (a columnar source's), not as records, so "
                         "the job, not the driver's hand-over, sets the full rate")
    ap.add_argument("--batch-rows", type=int, default=None,
                    help="the most inputs in one item (default: the job's, 16384)")
    ap.add_argument("--replication", choices=("flux", "cluster-pairs"), default="flux",
                    help="cluster-pairs: the paper's baseline (4.2): the victim's whole "
                         "replica set fails, and is rebuilt by a restart from a checkpoint "
                         "cut after the loss (a checkpoint folder is made for the run)")
    ap.add_argument("--checkpoint-interval", type=float, default=2.0,
                    help="seconds between checkpoints (--replication cluster-pairs)")
    ap.add_argument("--out", default="results/failover")
    args = ap.parse_args(argv)
    if args.duration is None:
        args.duration = 16.0 if args.quick else 40.0
    if args.kill_at is None:
        args.kill_at = args.duration / 2
    if args.nodes < 2 or args.standbys < 1:
        ap.error("a failover needs --nodes >= 2 and --standbys >= 1")
    if not 0 < args.kill_at < args.duration:
        ap.error(f"--kill-at must be within the run (0, {args.duration})")
    if args.rate <= 0:
        ap.error("--rate must be > 0")
    if args.state_mb < 0:
        ap.error("--state-mb must be >= 0")
    if args.kill in ("host", "cut") and not args.hosts:
        ap.error(f"--kill {args.kill} needs --hosts (the rig)")
    if args.hosts and args.hosts < args.nodes + args.standbys:
        ap.error(f"--hosts must be >= nodes + standbys ({args.nodes + args.standbys}): "
                 f"one task slot per host")
    if args.double and not args.kafka:
        ap.error("--double needs --kafka (a double failure restarts from a checkpoint)")
    if args.replication == "cluster-pairs" and (args.nodes % 2 or args.kafka or args.double):
        ap.error("--replication cluster-pairs needs an even --nodes, and no --kafka/--double")
    if args.kafka and args.hosts:
        ap.error("--kafka runs on the embedded local-cluster (the broker is on this machine)")
    if args.topic_partitions < 1:
        ap.error("--topic-partitions must be >= 1")
    if args.arrow_feed and (not (args.vectorized and args.max_rate) or args.kafka
                            or args.replication != "flux"):
        ap.error("--arrow-feed needs --vectorized --max-rate, and no --kafka or "
                 "--replication cluster-pairs")
    if args.batch_rows is not None and args.batch_rows < 1:
        ap.error("--batch-rows must be >= 1")
    if args.victim not in {node_name(k) for k in range(args.nodes)}:
        ap.error(f"--victim must be one of node0..node{args.nodes - 1}")
    return args


def fail_victim(job, args, rig) -> None:
    """The fault: a process or executor killed, or (on the rig) the victim's host killed
    whole or cut off silently."""
    if args.kill in ("worker", "executor"):
        # both of a pair at once: an executor's worker outlives its JVM by up to ~0.2 s
        # and could hand its state on meanwhile, so a double kill takes both (a machine)
        how = "machine" if args.double and args.kill == "executor" else args.kill
        job.kill_node(args.victim, how)
        if args.double:  # and the twin of one of its segments: that pair is lost
            where = job.topology.where
            mine = sorted(a for a, n in where.items() if n == args.victim)
            twin = mine[0]._replace(replica=1 - mine[0].replica)
            job.kill_node(where[twin], how)
        return
    host = next(i for i, h in enumerate(rig.hosts)
                if h.address == job.controller.hosts.get(args.victim))
    job.metrics.killed(f"{args.victim} ({args.kill} {rig.hosts[host].name})")
    if args.kill == "host":
        rig.kill_host(host)
    else:
        rig.cut(host)


def _kill_due(args, metrics, now: float) -> bool:
    """At ``--kill-at`` seconds; fed as fast as taken, once that share of the inputs
    came in (the job may take them all in a fraction of ``--duration``, and a kill after
    the last output would measure no failover at all)."""
    if args.max_rate:
        return metrics.input_total >= args.inputs * args.kill_at / args.duration
    return now >= args.kill_at


def _watch(job, args, expected: int, rig=None) -> None:
    """Show progress; kill the victim on time; return when the output is complete and
    the pair is rebuilt."""
    m, killed = job.metrics, False
    rec = lambda: job.controller.recovery  # noqa: E731
    with tqdm(total=round(args.duration, 1), unit="s", desc="data time",
              bar_format="{desc}: {n:.1f}/{total}s |{bar}| {postfix}") as bar:
        while True:
            now = time.monotonic() - m.t0 if m.t0 is not None else 0.0
            bar.n = min(round(now, 1), bar.total)
            bar.set_postfix_str(f"out={m.output_total}/{expected} "
                                f"{'killed ' + args.victim if killed else ''}")
            if not killed and m.t0 is not None and _kill_due(args, m, now):
                fail_victim(job, args, rig)
                killed = True
            if args.replication == "cluster-pairs":  # its set rebuilt by a restart
                recovered = bool(job.restart_log)
            else:
                recovered = args.double or (rec().completed and not rec().pending())
            if killed and job.finished() and recovered:
                break
            if now > args.duration * 4 + 120:
                raise TimeoutError(f"the run did not finish: {m.output_total}/{expected} outputs, "
                                   f"recovery missing {rec().missing}")
            job.wait_until(lambda: False, 0.2)  # sleeps, and raises a job error at once


def _first(events: List[tuple], what: str, after: float) -> Optional[float]:
    times = [t for t, w, _ in events if w == what and t >= after]
    return min(times) if times else None


def _last(events: List[tuple], what: str, after: float) -> Optional[float]:
    times = [t for t, w, _ in events if w == what and t >= after]
    return max(times) if times else None


def summarize(job, args, same: bool, expected: int) -> Dict[str, Any]:
    m = job.metrics
    base = m.summary()
    events = m.relative_events()
    kill = _first(events, "killed", 0.0)
    killed = {str(d).split(" ")[0] for _, what, d in events if what == "killed"}
    detected = _first(events, "detected", kill)
    takeover = _last(events, "take-over done", detected) if detected is not None else None
    catchup = _first(events, "catch-up done", detected) if detected is not None else None
    # cluster pairs: the lost set rebuilt by a restart from a checkpoint cut after the loss
    restart = _first(events, "restart", kill) if kill is not None else None
    data_again = _first(events, "data starts", restart) if restart is not None else None
    rows = m.timeline()
    out_rows = [r for r in rows if r["outputs"]]
    out_span = (out_rows[-1]["t_s"] - out_rows[0]["t_s"] + m.interval) if out_rows else 0.0
    rel = lambda t: round(t - kill, 6) if t is not None else None  # noqa: E731
    return {
        "replication": args.replication,
        "nodes": args.nodes, "standbys": args.standbys, "kill": args.kill,
        "victim": args.victim, "rate_asked_tps": None if args.max_rate else args.rate,
        "input_rate_tps": base["input_rate_tps"],
        "output_rate_tps": round(base["outputs"] / out_span, 1) if out_span else 0.0,
        "inputs": base["inputs"], "outputs": base["outputs"], "expected_outputs": expected,
        "dropped_inputs": base["dropped_inputs"],
        "output_matches_reference": same,
        "kill_at_s": kill, "detected_s": detected, "takeover_done_s": takeover,
        "restart_s": restart,
        "catchup_done_s": catchup,
        "detect_after_kill_s": rel(detected), "takeover_after_kill_s": rel(takeover),
        "catchup_after_kill_s": rel(catchup),
        "restart_after_kill_s": rel(restart), "data_again_after_kill_s": rel(data_again),
        "state_bytes_moved": base["state_bytes_moved"], "state_move_s": base["state_move_s"],
        "state_mb_per_partition": args.state_mb,
        # the longest the active of a catch-up held its sources paused (phase 2)
        "max_catchup_pause_s": base["max_catchup_pause_s"],
        # live processes declared dead: every detection but the killed ones'
        "false_detections": [d for _, what, d in base["events"] if what == "detected"
                             and str(d).split(" ")[0] not in killed],
        "stuck_reports": [d for _, what, d in base["events"] if what == "stuck"],
        "max_output_gap_s": base["max_output_gap_s"],
        "max_output_gap_end_s": base["max_output_gap_end_s"],
        # the longest wait between two outputs that ended after the kill (start-up apart)
        "max_output_gap_after_kill_s": base["max_output_gap_after_kill_s"],
        # the longest of the 5 s before the kill: what the job shows without a failure
        "max_output_gap_before_kill_s": base["max_output_gap_before_kill_s"],
        "median_interval_latency_ms": base["median_interval_latency_ms"],
        # a connection's batch waits this long for more before it is sent
        "flush_interval_s": job.config.flush_delay, "interval_s": m.interval,
        "batch_rows": job.config.batch_rows, "arrow_feed": args.arrow_feed,
        "events": base["events"],
    }


def write(job, summary: Dict[str, Any], out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = job.metrics.timeline()
    interval = job.metrics.interval
    with open(out / "timeline.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "inputs", "dropped", "outputs", "output_rate_tps", "avg_latency_ms"])
        for r in rows:
            w.writerow([r["t_s"], r["inputs"], r["dropped"], r["outputs"],
                        round(r["outputs"] / interval, 1), r["avg_latency_ms"]])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plot(rows, interval, summary, out / "failover.png")


def plot(rows: List[Dict[str, Any]], interval: float, summary: Dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot(t, [r["outputs"] / interval for r in rows], lw=0.8, color="tab:blue")
    top.set_ylabel("output rate (tuples/s)")
    bottom.plot(t, [r["avg_latency_ms"] for r in rows], lw=0.8, color="tab:purple")
    bottom.set_ylabel("average latency (ms)")
    bottom.set_xlabel(f"time (s), {interval * 1000:.0f} ms intervals")
    marks = [("kill_at_s", "kill", "tab:red"), ("takeover_done_s", "take-over done", "tab:orange"),
             ("catchup_done_s", "catch-up done", "tab:green"),
             ("restart_s", "restart (set rebuilt)", "tab:brown")]
    for key, label, color in marks:
        if summary.get(key) is not None:
            for ax in (top, bottom):
                ax.axvline(summary[key], color=color, ls="--", lw=1,
                           label=label if ax is top else None)
    top.legend(loc="lower left", fontsize=8)
    top.set_title(f"{summary['replication']} on Spark: {summary['nodes']} nodes + "
                  f"{summary['standbys']} standby, {summary['kill']} of {summary['victim']} "
                  f"killed")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = run(args)
    keys = ("input_rate_tps", "output_rate_tps", "dropped_inputs", "output_matches_reference",
            "kill_at_s", "detect_after_kill_s", "takeover_after_kill_s", "catchup_after_kill_s",
            "restart_after_kill_s", "data_again_after_kill_s",
            "state_bytes_moved", "state_move_s", "max_catchup_pause_s", "false_detections",
            "stuck_reports", "max_output_gap_s", "max_output_gap_before_kill_s",
            "max_output_gap_after_kill_s",
            "median_interval_latency_ms")
    for k in keys:
        print(f"{k:28s} {summary[k]}")
    print(f"wrote {args.out}/timeline.csv, summary.json, failover.png")
    ok = (summary["output_matches_reference"] and summary["dropped_inputs"] == 0
          and not summary["false_detections"])
    return 0 if ok else 1


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Prepare the input and its reference, run the job with one kill, write the results."""
    from flux.spark.job import FluxJob
    from flux.spark.session import local_cluster

    budget = MAX_RATE_BUDGET if args.max_rate else args.rate
    n = args.inputs = int(budget * args.duration)
    print(f"preparing {n} packets and their failure-free output ...", flush=True)
    records = packet_workload(n, seed=args.seed, pairs=PAIRS, apps=APPS, sources=SOURCES)
    if args.vectorized and args.state_mb:
        raise SystemExit("--state-mb pads the per-record operators' state; not with --vectorized")
    # the per-record dataflow's reference: the vectorized one gives it SN for SN (a test
    # compares them), and computes it ~100x faster
    reference = ballast_paper_dataflow(args.state_mb) if args.state_mb else paper_dataflow()
    dataflow = vectorized_dataflow() if args.vectorized else reference
    expected = reference_output(reference, records, args.nodes)
    with contextlib.ExitStack() as stack:
        rig = kafka = None
        if args.hosts:
            from flux.testing.rig import Rig

            print(f"starting the rig: a standalone cluster of {args.hosts} hosts ...", flush=True)
            rig = stack.enter_context(Rig(args.hosts))
            spark = rig.session("flux-failover")
        else:
            print(f"starting a local-cluster of {args.nodes + args.standbys + 1} executors ...",
                  flush=True)
            spark = stack.enter_context(local_cluster(args.nodes + args.standbys + 1))
        if args.kafka:
            kafka = stack.enter_context(KafkaRun(args, records))
            source, sink, extra = kafka.source, kafka.sink, kafka.job_settings()
        else:
            source = records if args.max_rate else RateLimited(records, args.rate)
            if args.arrow_feed:
                from experiments.throughput import as_batches
                source = as_batches(records)
            sink, extra = None, {}
        if args.item_delay is not None:
            extra["item_delay"] = args.item_delay
        if args.batch_rows is not None:
            extra["batch_rows"] = args.batch_rows
        if args.replication == "cluster-pairs":  # a lost set is rebuilt from a checkpoint
            source = records if args.max_rate else Paced(records, args.rate)
            extra.update(replication=args.replication, checkpoint=stack.enter_context(
                tempfile.TemporaryDirectory(prefix="flux-failover-cp-")),
                checkpoint_interval=args.checkpoint_interval)
        job = FluxJob(spark, dataflow, source, nodes=args.nodes, standbys=args.standbys,
                      sink=sink, **extra)
        with job:
            _watch(job, args, len(expected), rig)
            if rig is not None:
                for i, h in enumerate(rig.hosts):
                    if h.cut:
                        rig.heal(i)
        if kafka is not None:  # the reference of the order the job numbered the inputs
            expected = reference_output(reference, kafka.source.inputs, args.nodes)
            got = kafka.output()
            same = got == [wire_form(r) for _, r in expected]
        else:
            same = [wire_form(x) for x in job.delivered] == [wire_form(x) for x in expected]
    summary = summarize(job, args, same, len(expected))
    if kafka is not None:
        summary.update(kafka.summary(job))
    write(job, summary, pathlib.Path(args.out))
    return summary


class KafkaRun:
    """``--kafka``: a broker, an input topic fed with the packets, an output topic behind a
    transactional sink, a checkpoint folder; all removed at the end."""

    def __init__(self, args, records):
        self.args, self.records = args, records

    def __enter__(self) -> "KafkaRun":
        import tempfile

        from experiments.kafka_io import Feed, RecordedOrder
        from flux.examples.sessions import session_key
        from flux.testing.kafka_broker import KafkaBroker
        from flux.connectors.kafka_sink import KafkaSink
        from flux.connectors.kafka_source import KafkaSource

        args = self.args
        self.folder = tempfile.TemporaryDirectory(prefix="flux-failover-kafka-")
        print("starting a Kafka-protocol broker (noida-db) ...", flush=True)
        self.broker = KafkaBroker().start()
        self.broker.create_topic("packets", args.topic_partitions)
        self.broker.create_topic("stats", 1)
        # every (src, dst) pair's packets in one partition, in order (a keyed producer);
        # --vectorized: as JSON objects, read as Arrow batches (KafkaSource(schema=...))
        schema = None
        if args.vectorized:
            from flux.examples.vectorized import PACKET_SCHEMA as schema
        objects = {"encode": lambda r: json.dumps(dict(zip(schema.names, r))).encode()} \
            if schema else {}
        self.feed = Feed(self.broker.bootstrap, "packets", self.records, args.topic_partitions,
                         float("inf") if args.max_rate else args.rate, key=session_key,
                         **objects)
        self.feed.start()
        if args.max_rate:  # the topic full before the job reads: the rate is the job's
            self.feed._thread.join()
        self.source = RecordedOrder(KafkaSource(self.broker.bootstrap, "packets",
                                                group="flux-failover",
                                                ending=self.feed.ending, schema=schema))
        self.sink = KafkaSink(self.broker.bootstrap, "stats", "flux-failover")
        return self

    def job_settings(self) -> dict:
        return {"checkpoint": self.folder.name, "checkpoint_interval": 2.0}

    def output(self) -> list:
        from experiments.kafka_io import read_output

        self.sink.close()
        return read_output(self.broker.bootstrap, "stats")

    def summary(self, job) -> dict:
        return {"kafka_topic_partitions": self.args.topic_partitions,
                "double_failure": self.args.double,
                "restarts": [[round(t - job.metrics.t0, 3), k, why]
                             for t, k, why in job.restart_log],
                "checkpoints_complete": len(job.checkpoints.completed),
                "kafka_sink_commits": self.sink.commits,
                "feed_errors": [str(e) for e in self.feed.error]}

    def __exit__(self, *exc) -> None:
        self.feed.stop()
        self.source.close()
        self.sink.close()
        self.broker.stop()
        self.folder.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
