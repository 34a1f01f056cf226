"""python -m experiments.chaos --runs N --seed S: random kills, and the output must not notice.

Every run deploys a dataflow on one embedded local-cluster (4 nodes + 1
standby + 1 warm spare), feeds it at a steady rate, and kills nodes while it
runs, in one of these scenarios (drawn at random):

- ``one``: one node (worker or executor) at a random moment;
- ``two-pairs``: one node, then, once its pair is rebuilt, a node of another pair;
- ``same-pair``: one node, then, once its pair is rebuilt, the node now holding
  the rebuilt replica or the other replica's node (a rebuilt pair is whole again);
- ``standby-during-catch-up``: one node, then the standby receiving its state,
  while the state moves (catch-up starts again on the next standby);
- ``double``: both replicas of a partition at once (each node's worker, or its
  worker and executor together, as a machine crash): the job must stop with an
  error naming the partition, and the output delivered until then must be a
  prefix of the reference;
- ``double-restart``: both replicas of a partition at once, in a job that
  checkpoints (every 0.5-2 s, to a fresh folder, into a ``FileSink`` or kept in
  memory): it must restart by itself from its last checkpoint (or from the first
  input, if none was complete yet), and the output must be the reference;
- ``ingress-kill``: the ingress's process (a process of its own
  beside the driver) is SIGKILLed, as the OOM killer would, in a job that
  checkpoints as above: it must restart from its last checkpoint, and the
  output must be the reference;
- ``egress-kill`` (with ``--per-partition``, or named): each partition's egress on an
  executor (``egress_on_executors``) writing a ``FileSink`` of its own; the node
  running one partition's egress is killed (its worker or executor): the egress
  must start again beside the surviving replica, and every partition's sink must
  hold that partition's reference, in order, none twice;
- with ``--splits``, the input is read on the executors (a ``ListSplits`` of 4 splits,
  each paced at rate / 4, every split read by a pair of ingresses in the node
  processes) into ``relaying_dataflow`` (its outputs name their inputs, so the
  reference is the failure-free run over the inputs in the order the job numbered
  them); the node scenarios run as above, ``ingress-kill`` kills the node of a
  random split's leading ingress replica instead (its worker or executor): the
  survivor must lead alone, the lost replica be rebuilt, the output be the
  reference; ``egress-kill`` runs as above, no record crossing the driver
  (each partition's sink must hold, in order, that partition's part of the
  reference); ``double-restart`` checkpoints as above (the pairs of ingresses write
  their splits' logs) with the output kept in the driver or, drawn, a ``FileSink``
  per partition on the executors: both nodes of a pair are killed, the job restarts
  from its last checkpoint and each pair follows its split's log; and
  ``driver-kill`` runs ``experiments.resumable_job --splits 3``;
- ``driver-kill``: the driver of ``experiments.resumable_job`` (its own Spark,
  in a process group of its own) is SIGKILLed at a random moment, once or
  twice, and the program run again with the same checkpoint location: the
  sink (JSON lines, Parquet or Delta, drawn) must hold the reference;
- with ``--hosts N`` (the multi-host rig, ``flux.testing.rig``; needs root), also
  ``silent-host``: a node's host is cut off silently (no FIN; its processes run
  on) until the output is complete, and ``partition-heal``: a node's host is cut
  off for 0.2-2 s, shorter or longer than the detection, then healed (declared
  dead or not, nothing it says after may count).

The dataflow is the paper's (sessions, then windowed statistics) or a
counting dataflow whose one-to-many operators expose their running count in
every output (a wrong state restore shows in the output). A run passes when
the output equals the failure-free reference, the feed dropped nothing and
every lost replica was rebuilt (for ``double``: the error and the prefix).
The last line is ``runs=N failures=F``; a failure prints its run seed (replay
it with ``--run-seed``) and the run's event log.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from flux.errors import PairLost
from flux.examples import paper_dataflow
from flux.testing.dataflows import counting_dataflow, relayed_mismatch, relaying_dataflow, \
    with_ballast
from flux.addresses import Addr, P
from flux.connectors.split_sources import ListSplits
from flux.operator import wire_form
from flux.reference import ReferenceRun
from flux.connector_api import SinkPerPartition
from flux.connectors.file_sink import FileSink, read_file_sink
from flux.connectors.sources import Paced, RateLimited
from controller.topology import node_name
from flux.testing.workloads import keyed_workload, packet_workload

HOST_SCENARIOS = ("silent-host", "partition-heal")
#: scenarios that restart the job; driver-kill runs a Spark of its own
RESTART_SCENARIOS = ("double-restart", "ingress-kill", "driver-kill")
#: scenarios that run with checkpoints and must restart from one
CHECKPOINTED = ("double-restart", "ingress-kill")
SCENARIOS = ("one", "two-pairs", "same-pair", "standby-during-catch-up", "double",
             *RESTART_SCENARIOS, *HOST_SCENARIOS, "egress-kill")
#: the scenarios of ``--splits``
SPLIT_SCENARIOS = ("one", "two-pairs", "same-pair", "standby-during-catch-up", "ingress-kill",
                   "egress-kill", "double-restart", "driver-kill")
SPLITS = 4
NODES, STANDBYS = 4, 1


@dataclass
class Run:
    seed: int
    scenario: str
    dataflow: str
    kills: List[str] = field(default_factory=list)  # "name (how) at t s"
    ok: bool = False
    why: str = ""
    events: List[Any] = field(default_factory=list)
    seconds: float = 0.0


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.chaos", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--run-seed", type=int, default=None,
                    help="replay one run (its seed is printed when it fails)")
    ap.add_argument("--packets", type=int, default=60_000, help="input records per run")
    ap.add_argument("--rate", type=float, default=10_000.0, help="input records per second")
    ap.add_argument("--scenarios", default=None,
                    help=f"comma-separated subset of {', '.join(SCENARIOS)} (default: all; "
                         f"{', '.join(HOST_SCENARIOS)} only with --hosts)")
    ap.add_argument("--state-mb", type=float, default=0.0,
                    help="extra keyed state per partition (MB, Ballast in the first stage)")
    ap.add_argument("--hosts", type=int, default=0,
                    help="run on the multi-host rig with this many hosts (needs root)")
    ap.add_argument("--per-partition", action="store_true",
                    help="an egress per partition (ordered_output=False), each with a sink "
                         "of its own; driver-kill is left out (its program has one order)")
    ap.add_argument("--splits", action="store_true",
                    help=f"the input read on the executors, {SPLITS} splits (scenarios "
                         f"{', '.join(SPLIT_SCENARIOS)})")
    ap.add_argument("--out", default="results/chaos")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.packets < 1000:
        ap.error("--packets must be >= 1000 (a kill needs time to happen mid-stream)")
    if args.rate <= 0:
        ap.error("--rate must be > 0")
    if args.splits and args.hosts:
        ap.error("--splits runs on the embedded cluster (not with --hosts)")
    if args.scenarios is None and args.splits:
        args.scenarios = ",".join(SPLIT_SCENARIOS)
    if args.scenarios is None:
        args.scenarios = ",".join(s for s in SCENARIOS
                                  if ((s not in HOST_SCENARIOS) != bool(args.hosts)
                                      or args.hosts and s != "driver-kill")
                                  and not (args.per_partition and s == "driver-kill")
                                  and (args.per_partition or s != "egress-kill"))
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown or not args.scenarios:
        ap.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.splits and set(args.scenarios) - set(SPLIT_SCENARIOS):
        ap.error(f"--splits runs {', '.join(SPLIT_SCENARIOS)} only")
    if set(args.scenarios) & set(HOST_SCENARIOS) and not args.hosts:
        ap.error(f"{', '.join(HOST_SCENARIOS)} need --hosts (the rig)")
    if args.hosts and "driver-kill" in args.scenarios:
        ap.error("driver-kill runs an embedded cluster of its own: not with --hosts")
    if args.hosts and args.hosts < NODES + STANDBYS:
        ap.error(f"--hosts must be >= {NODES + STANDBYS} (a task slot per host)")
    if not args.scenarios:
        ap.error("no scenario given")
    return args


def neighbours(node: int) -> List[int]:
    """Chained declustering: node k shares partition k with node k+1 and k-1 with k-1."""
    return [(node - 1) % NODES, (node + 1) % NODES]


def workload(rng: random.Random, packets: int):
    if rng.random() < 0.5:
        return "paper", paper_dataflow(), packet_workload(
            packets, seed=rng.randrange(1 << 30), pairs=20_000, apps=10, sources=500)
    return "counting", counting_dataflow(2), keyed_workload(
        packets, seed=rng.randrange(1 << 30), keys=64)


class ExpectedOutput:
    """The reference a run's output must equal: in one order, or, with an egress per
    partition (``per_partition``), each last-stage partition's outputs in its order (the
    partitions' interleave as they come)."""

    def __init__(self, dataflow, records, per_partition: bool):
        run = ReferenceRun(dataflow, NODES)
        outputs = [(tuple(sn), wire_form(r)) for rec in records for sn, r in run.feed(rec)]
        self.ordered, self.per_partition = outputs, per_partition
        self.partition_of = {sn: p for (sn, _), p in zip(outputs, run.output_partitions)}
        self.parts = self._split(outputs)

    def _split(self, outputs) -> List[list]:
        parts: List[list] = [[] for _ in range(NODES)]
        for sn, record in outputs:
            parts[self.partition_of[sn]].append((sn, record))
        return parts

    def _wire(self, output) -> list:
        return [(tuple(sn), wire_form(r)) for sn, r in output]

    def equals(self, output) -> bool:
        got = self._wire(output)
        return self.equals_by_partition(self._split(got)) if self.per_partition \
            else got == self.ordered

    def equals_by_partition(self, parts: List[list]) -> bool:
        return [self._wire(p) for p in parts] == self.parts

    def is_prefix(self, output) -> bool:
        got = self._wire(output)
        if not self.per_partition:
            return got == self.ordered[:len(got)]
        return all(part == want[:len(part)] for part, want in
                   zip(self._split(got), self.parts))


class Chaos:
    """One run: a job, its kills, and the checks."""

    def __init__(self, spark, run: Run, rng: random.Random, args, rig=None):
        from flux.spark.job import FluxJob

        self.run, self.rng, self.args, self.rig = run, rng, args, rig
        self.folder: Optional[str] = None  # a run's files, removed by ``close``
        if args.splits:  # read on the executors, into a dataflow naming its inputs
            run.dataflow = "relaying, 4 splits"
            self.records = [tuple(r) for r in keyed_workload(
                args.packets, seed=rng.randrange(1 << 30), keys=64)]
            self.feed = ListSplits([self.records[k::SPLITS] for k in range(SPLITS)],
                                   rate=args.rate / SPLITS)
            self.duration, self.sink, self.output = args.packets / args.rate, None, None
            egresses = {}
            restarts = run.scenario == "double-restart"
            if restarts or run.scenario == "egress-kill":
                self.folder = tempfile.mkdtemp(prefix="flux-chaos-")
            if run.scenario == "egress-kill" or restarts and rng.random() < 0.5:
                # each partition's egress on an executor, into its own FileSink
                self.sink = SinkPerPartition(lambda p: FileSink(f"{self.folder}/out/{p}"))
                egresses = dict(ordered_output=False, egress_on_executors=True,
                                sink=self.sink)
            if restarts:  # the pairs write their splits' logs; cuts at epochs' ends
                interval = rng.choice((0.5, 1.0, 2.0))
                run.kills.append(f"checkpoints every {interval}s"
                                 + (", a FileSink per partition" if self.sink else ""))
                egresses.update(checkpoint=f"{self.folder}/ckpt",
                                checkpoint_interval=interval)
            self.job = FluxJob(spark, relaying_dataflow(), self.feed, nodes=NODES,
                               standbys=STANDBYS, **egresses)
            return
        name, dataflow, records = workload(rng, args.packets)
        if args.state_mb:
            dataflow = with_ballast(dataflow, args.state_mb)
        run.dataflow = name
        egress_kill = run.scenario == "egress-kill"
        self.output = ExpectedOutput(dataflow, records, args.per_partition or egress_kill)
        egresses = dict(ordered_output=False) if args.per_partition else {}
        self.duration = args.packets / args.rate
        self.sink = None
        if egress_kill:  # each partition's egress on an executor, into its own FileSink
            self.folder = tempfile.mkdtemp(prefix="flux-chaos-")
            self.sink = SinkPerPartition(lambda p: FileSink(f"{self.folder}/out/{p}"))
            egresses = dict(ordered_output=False, egress_on_executors=True, sink=self.sink)
        if run.scenario in CHECKPOINTED:  # a replayable feed, checkpoints, maybe a sink
            self.folder = tempfile.mkdtemp(prefix="flux-chaos-")
            self.feed = Paced(records, args.rate)
            interval = rng.choice((0.5, 1.0, 2.0))
            if rng.random() < 0.5:
                self.sink = FileSink(f"{self.folder}/out", commit_every=50_000) \
                    if not args.per_partition else SinkPerPartition(
                        lambda p: FileSink(f"{self.folder}/out/{p}", commit_every=50_000))
            run.kills.append(f"checkpoints every {interval}s"
                             + (", FileSink" if self.sink else ""))
            self.job = FluxJob(spark, dataflow, self.feed, nodes=NODES, standbys=STANDBYS,
                               sink=self.sink, keep_output=True,
                               checkpoint=f"{self.folder}/ckpt", checkpoint_interval=interval,
                               **egresses)
            return
        self.feed = RateLimited(records, args.rate)
        self.job = FluxJob(spark, dataflow, self.feed, nodes=NODES, standbys=STANDBYS,
                           **egresses)

    # -- helpers -----------------------------------------------------------------------
    def recovery(self):
        return self.job.controller.recovery

    def now(self) -> float:
        t0 = self.job.metrics.t0
        return time.monotonic() - t0 if t0 is not None else 0.0

    def kill(self, name: str, at_once: bool = False) -> None:
        """Its worker or its executor; ``at_once``: nothing of it left an instant later
        (an executor's worker outlives the JVM by up to ~0.2 s and serves its pairs, a
        catch-up from it included: a machine crash kills both)."""
        how = self.rng.choice(("worker", "executor"))
        if at_once and how == "executor":
            how = "machine"
        self.run.kills.append(f"{name} ({how}) at {self.now():.2f}s")
        self.job.kill_node(name, how)

    def wait(self, predicate, what: str, timeout: float = 120.0) -> None:
        if not self.job.wait_until(predicate, timeout):
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")

    def rebuilt(self) -> bool:
        rec = self.recovery()
        return bool(rec.completed) and not rec.pending()

    def holder(self, node: str) -> str:
        """Who hosts, now, what ``node`` hosted (its replacement after a catch-up)."""
        return self.recovery().replacement.get(node, node)

    def catching_up(self) -> Optional[str]:
        """The standby receiving state right now, if any."""
        for attempt in list(self.recovery().attempts.values()):
            return attempt.standby
        return None

    # -- the scenarios -----------------------------------------------------------------
    def start_kill_at(self) -> None:
        at = self.rng.uniform(0.15, 0.45) * self.duration
        self.wait(lambda: self.now() >= at, "the first kill's moment")

    def cut(self, name: str) -> int:
        """Cut ``name``'s host off the rig's network, silently."""
        rig = self.rig
        i = next(k for k, h in enumerate(rig.hosts)
                 if h.address == self.job.controller.hosts.get(name))
        self.run.kills.append(f"{name}'s host {rig.hosts[i].name} cut at {self.now():.2f}s")
        rig.cut(i)
        return i

    def play(self) -> None:
        scenario = self.run.scenario
        first = self.rng.randrange(NODES)
        self.start_kill_at()
        if scenario == "silent-host":
            self.cut(node_name(first))  # healed once the run is over
            return
        if scenario == "partition-heal":
            i = self.cut(node_name(first))
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.run.kills.append(f"healed at {self.now():.2f}s")
            self.rig.heal(i)
            return
        if scenario == "egress-kill":  # the node that runs one partition's egress
            partition = self.rng.randrange(NODES)
            self.run.kills.append(f"partition {partition}'s egress:")
            self.kill(self.recovery().writers.node[partition])
            return
        if scenario == "ingress-kill" and self.args.splits:  # a split's leading replica
            split = self.rng.randrange(SPLITS)
            self.run.kills.append(f"split {split}'s leading ingress:")
            self.kill(self.holder(self.job.topology.where[Addr(0, split, P)]))
            return
        if scenario == "ingress-kill":  # its process, as the OOM killer would
            pid = self.job.ingress_pid
            self.run.kills.append(f"the ingress process (pid {pid}) at {self.now():.2f}s")
            os.kill(pid, signal.SIGKILL)
            return
        if scenario in ("double", "double-restart"):
            partner = self.rng.choice(neighbours(first))
            self.kill(node_name(first), at_once=True)
            self.kill(node_name(partner), at_once=True)
            return
        self.kill(node_name(first))
        if scenario == "one":
            return
        if scenario == "standby-during-catch-up":
            self.wait(lambda: self.catching_up() is not None or self.rebuilt(),
                      "catch-up to start", 60)
            standby = self.catching_up()
            if standby is None:
                raise RuntimeError("catch-up was over before the standby could be killed")
            self.kill(standby)
            return
        self.wait(self.rebuilt, "the first pair to be rebuilt")
        if scenario == "two-pairs":
            others = [n for n in range(NODES) if n != first and n not in neighbours(first)]
            others = others or [n for n in range(NODES) if n != first]
            self.kill(self.holder(node_name(self.rng.choice(others))))
        else:  # same-pair: the rebuilt replica's node, or its partner's
            self.kill(self.rng.choice([self.holder(node_name(first)),
                                       self.holder(node_name(self.rng.choice(neighbours(first))))]))

    def check(self) -> None:
        job, run = self.job, self.run
        if run.scenario == "double":
            try:
                job.wait(timeout=120)
            except PairLost as exc:
                if not self.output.is_prefix(job.delivered):
                    raise AssertionError("the output before the double failure is not a "
                                         "prefix of the reference") from exc
                if "partition" not in str(exc):
                    raise AssertionError(f"the error does not name the partition: {exc}")
                return
            raise AssertionError("the job went on after both replicas of a pair died")
        output = job.wait(timeout=240)
        if run.scenario in CHECKPOINTED and not self.args.splits:
            self.check_restarted(output)
            return
        if run.scenario == "double-restart":  # with --splits
            self.check_restart_log()
        self.wait(lambda: not self.recovery().pending() and not self.catching_up(),
                  "every pair to be rebuilt")
        if self.job.controller.dead and not self.recovery().completed:
            raise AssertionError("a node was declared dead and nothing was rebuilt")
        # with a sink (here: one per partition on the executors) the sinks hold the
        # output, and ``check_sink`` reads them once the job stopped
        if self.sink is None and self.args.splits:
            self.check_split_output(output)
        elif self.sink is None and not self.output.equals(output):
            raise AssertionError(f"output differs from the reference ({len(output)} outputs, "
                                 f"{len(self.output.ordered)} expected)")
        if not self.args.splits and self.feed.dropped:  # a split waits, never drops
            raise AssertionError(f"the feed dropped {self.feed.dropped} records")

    def check_split_output(self, output) -> None:
        """Every input once, each split's in its order, and the output the failure-free
        run's over the inputs in the order the job numbered them."""
        wrong = relayed_mismatch(output, self.records,
                                 [self.records[k::SPLITS] for k in range(SPLITS)], NODES)
        if wrong is not None:
            raise AssertionError(wrong)

    def check_split_sinks(self) -> None:
        """Each partition's sink in SN order, and all of them together the output of the
        failure-free run over the inputs in the order the job numbered them."""
        parts = [[(tuple(sn), r) for sn, r in read_file_sink(f"{self.folder}/out/{p}")]
                 for p in range(NODES)]
        for p, part in enumerate(parts):
            if [sn for sn, _ in part] != sorted(set(sn for sn, _ in part)):
                raise AssertionError(f"partition {p}'s sink is not in SN order, or holds an "
                                     "output twice")
        self.check_split_output(sorted(out for part in parts for out in part))


    def check_restart_log(self) -> None:
        job, run = self.job, self.run
        if not job.restart_log:
            raise AssertionError(f"{run.scenario}: the job did not restart")
        for when, restored, why in job.restart_log:
            run.kills.append(f"restarted from checkpoint {restored} "
                             f"at {when - job.metrics.t0:.2f}s")

    def check_restarted(self, output) -> None:
        self.check_restart_log()
        if not self.output.equals(output):
            raise AssertionError(f"output differs from the reference ({len(output)} outputs, "
                                 f"{len(self.output.ordered)} expected)")

    def check_sink(self) -> None:
        """Once the job stopped (it owns its sink until then, and closes it): the FileSink's
        committed content is the reference."""
        if self.sink is None:
            return
        if self.args.splits:
            self.check_split_sinks()
        elif self.args.per_partition or self.run.scenario == "egress-kill":
            got = [[(tuple(sn), r) for sn, r in read_file_sink(f"{self.folder}/out/{p}")]
                   for p in range(NODES)]
            if not self.output.equals_by_partition(got):
                raise AssertionError("the sinks' committed content is not the reference's, "
                                     "partition by partition")
        elif read_file_sink(f"{self.folder}/out") != self.output.ordered:
            raise AssertionError("the FileSink's committed content is not the reference")

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def play_driver_kill(run: Run, rng: random.Random, args) -> None:
    """Run ``experiments.resumable_job``, SIGKILL its driver at a random moment (once or
    twice), run it again with the same checkpoint location until it is done; its sink
    must hold the failure-free output. Its Spark is its own: no other runs meanwhile."""
    from experiments.resumable_job import Program, per_key, read_sink, write_inputs

    folder = pathlib.Path(tempfile.mkdtemp(prefix="flux-chaos-"))
    try:
        fmt = rng.choice(("jsonl", "parquet", "delta"))
        interval = rng.choice((0.5, 1.0, 2.0))
        run.dataflow = f"counting from files into {fmt}"
        expected = write_inputs(folder / "in", args.packets, seed=rng.randrange(1 << 30))
        cli = ["--input", str(folder / "in"), "--sink", str(folder / "out"), "--sink-format",
               fmt, "--checkpoint", str(folder / "ckpt"), "--interval", str(interval),
               "--rate", str(args.rate)] + (["--splits", "3"] if args.splits else [])
        run.kills.append(f"checkpoints every {interval}s"
                         + (", read as 3 splits on the executors" if args.splits else ""))
        for attempt in range(rng.choice((1, 1, 2))):
            program = Program(cli, folder / f"driver{attempt}.log")
            try:
                started = program.wait_for(lambda x: x["kind"] == "started", 180)
                at = started["cut"] + rng.uniform(0.1, 0.6) * (args.packets - started["cut"])
                program.wait_for(lambda x: x["kind"] == "done" or x.get("inputs", 0) >= at, 300)
            finally:
                program.kill()
            run.kills.append(f"driver killed (run {attempt + 1}, started at checkpoint "
                             f"{started['checkpoint']})")
        program = Program(cli, folder / "driver-last.log")
        try:
            started = program.wait_for(lambda x: x["kind"] == "started", 180)
            program.wait_for(lambda x: x["kind"] == "done", 300)
        finally:
            program.kill()
        run.kills.append(f"run again from checkpoint {started['checkpoint']} "
                         f"(cut {started['cut']})")
        got = read_sink(fmt, str(folder / "out"))
        if args.splits:  # numbered in the job's order: the same key by key, each once
            sns = [tuple(sn) for sn, _ in got]
            if sns != sorted(set(sns)) or per_key(got) != per_key(expected):
                raise AssertionError(f"the sink holds {len(got)} outputs, not the "
                                     f"{len(expected)} of the reference key by key (or an "
                                     "SN twice, or out of order)")
        elif got != expected:
            raise AssertionError(f"the sink holds {len(got)} outputs, not the "
                                 f"{len(expected)} of the reference (or not in order)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def heal_all(rig) -> None:
    for i, h in enumerate(rig.hosts if rig is not None else ()):
        if h.cut:
            rig.heal(i)


def detected_before_the_first_kill(events: List[tuple]) -> List[str]:
    """The detections that came before the run's first kill: false ones, which change
    what the scenario meant to test (a pair already rebuilt elsewhere, a standby used);
    named in a failed run's reason, so its cause is read at once."""
    first_kill = next((t for t, what, _ in events if what == "killed"), None)
    if first_kill is None:
        return []
    return [str(detail) for t, what, detail in events if what == "detected" and t < first_kill]


def run_one(spark, seed: int, args, rig=None) -> Run:
    rng = random.Random(seed)
    run = Run(seed, rng.choice(args.scenarios), "")
    started = time.monotonic()
    chaos = None
    if run.scenario == "driver-kill":
        try:
            play_driver_kill(run, rng, args)
            run.ok = True
        except Exception as exc:  # noqa: BLE001 - every failure is reported with its seed
            run.why = f"{type(exc).__name__}: {exc}"
        run.seconds = round(time.monotonic() - started, 1)
        return run
    try:
        chaos = Chaos(spark() if callable(spark) else spark, run, rng, args, rig)
        with chaos.job:
            try:
                chaos.play()
            except PairLost:
                if run.scenario != "double":
                    raise
            chaos.check()
            heal_all(rig)  # before the job stops: its tasks there must hear the stop
        chaos.check_sink()
        run.ok = True
    except Exception as exc:  # noqa: BLE001 - every failure is reported with its seed
        run.why = f"{type(exc).__name__}: {exc}"
    finally:
        if chaos is not None:
            run.events = chaos.job.metrics.relative_events()
            early = detected_before_the_first_kill(run.events)
            if early and not run.ok:
                run.why += f" (declared dead before the first kill: {'; '.join(early)})"
            chaos.close()
        heal_all(rig)
        run.seconds = round(time.monotonic() - started, 1)
    return run


class LazyCluster:
    """The embedded cluster the runs share, started when a run needs it and released
    before a run that starts a Spark of its own."""

    def __init__(self, make):
        self.make, self._cm, self.session = make, None, None

    def __call__(self):
        if self.session is None:
            self._cm = self.make()
            self.session = self._cm.__enter__()
        return self.session

    def release(self) -> None:
        if self._cm is not None:
            cm, self._cm, self.session = self._cm, None, None
            cm.__exit__(None, None, None)


def main(argv=None) -> int:
    from flux.spark.session import local_cluster

    args = parse_args(argv)
    seeds = ([args.run_seed] if args.run_seed is not None
             else [random.Random(args.seed).randrange(1 << 30) + k for k in range(args.runs)])
    runs: List[Run] = []
    with contextlib.ExitStack() as stack:
        rig = None
        if args.hosts:
            from flux.testing.rig import Rig

            rig = stack.enter_context(Rig(args.hosts))
            session = rig.session("flux-chaos")
            spark = lambda: session  # noqa: E731
        else:
            spark = LazyCluster(lambda: local_cluster(NODES + STANDBYS + 1))
            stack.callback(spark.release)
        for k, seed in enumerate(seeds, 1):
            if isinstance(spark, LazyCluster) and random.Random(seed).choice(
                    args.scenarios) == "driver-kill":
                spark.release()  # its program runs a Spark of its own: never two at once
            run = run_one(spark, seed, args, rig)
            runs.append(run)
            status = "ok" if run.ok else "FAILED"
            print(f"run {k}/{len(seeds)} seed={seed} {run.scenario} {run.dataflow}: "
                  f"{'; '.join(run.kills) or 'no kill'} -> {status} ({run.seconds}s)", flush=True)
            if not run.ok:
                print(f"  why: {run.why}")
                for event in run.events:
                    print(f"  {event[0]:8.3f}s {event[1]} {event[2]}")
    failures = sum(not r.ok for r in runs)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts: Dict[str, int] = {}
    for r in runs:
        counts[r.scenario] = counts.get(r.scenario, 0) + 1
    (out / "summary.json").write_text(json.dumps({
        "runs": len(runs), "failures": failures, "scenarios": counts,
        "runs_detail": [{"seed": r.seed, "scenario": r.scenario, "dataflow": r.dataflow,
                         "kills": r.kills, "ok": r.ok, "why": r.why, "seconds": r.seconds,
                         "events": [list(e) for e in r.events]}
                        for r in runs]}, indent=2) + "\n")
    print(f"runs={len(runs)} failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
