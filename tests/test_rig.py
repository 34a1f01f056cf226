"""Across hosts, on the rig: a Spark standalone cluster whose workers are
hosts of their own (network namespaces on a bridge). A host cut off silently is
detected and masked and, when it comes back, fenced; a host killed whole is masked;
no pair ever shares a host; the rig leaves nothing behind (slow: Spark, root)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from flux.examples import paper_dataflow
from flux.operator import wire_form
from flux.reference import reference_output
from flux.connectors.sources import RateLimited
from flux.testing.workloads import packet_workload

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (namespaces)")]

HOSTS, NODES, STANDBYS, RATE = 5, 4, 1, 2000.0


@pytest.fixture(scope="module")
def rig():
    from flux.testing.rig import Rig

    with Rig(HOSTS) as rig:
        rig.session("flux-rig-tests")
        yield rig


def host_index(rig, job, name: str) -> int:
    return next(i for i, h in enumerate(rig.hosts) if h.address == job.controller.hosts[name])


def run_with_a_fault(rig, fault, seconds: float = 12.0, at: float = 5.0, **options):
    """A job of the paper's dataflow at RATE on the rig; ``fault(job)`` at ``at`` s; the
    job's output, its reference and the job (stopped)."""
    from flux.spark.job import FluxJob

    records = packet_workload(int(RATE * seconds), seed=5, pairs=5000, apps=10, sources=200)
    dataflow = paper_dataflow()
    expected = reference_output(dataflow, records, NODES)
    feed = RateLimited(records, RATE)
    job = FluxJob(rig.spark, dataflow, feed, nodes=NODES, standbys=STANDBYS, **options)
    with job:
        job.wait_until(lambda: job.metrics.t0 is not None
                       and time.monotonic() - job.metrics.t0 >= at, 60)
        after = fault(job)
        output = job.wait(timeout=180)
        rec = job.controller.recovery
        assert job.wait_until(lambda: rec.completed and not rec.pending(), 60)
        if after is not None:
            after(job)
    assert feed.dropped == 0
    return output, expected, job


def pairs_on_distinct_hosts(job) -> bool:
    hosts = job.controller.hosts
    nodes = job.topology.nodes
    return all(hosts[nodes[k]] != hosts[nodes[(k + 1) % len(nodes)]] for k in range(len(nodes)))


@pytest.mark.timeout(300)
def test_every_host_is_a_machine_of_its_own_with_a_routable_address(rig):
    def where(index, _):
        import os

        yield os.environ.get("SPARK_LOCAL_IP"), os.stat("/proc/self/ns/net").st_ino

    seen = rig.spark.sparkContext.parallelize(range(HOSTS), HOSTS) \
        .mapPartitionsWithIndex(where).collect()
    addresses = {a for a, _ in seen}
    assert addresses == {h.address for h in rig.hosts} and "127.0.0.1" not in addresses
    assert len({ns for _, ns in seen}) == HOSTS
    assert os.stat("/proc/self/ns/net").st_ino not in {ns for _, ns in seen}


@pytest.mark.timeout(400)
def test_a_host_cut_off_silently_is_masked_and_fenced_when_it_comes_back(rig):
    victim: dict = {}

    def cut(job):
        assert pairs_on_distinct_hosts(job)
        victim["i"] = host_index(rig, job, "node1")
        rig.cut(victim["i"])
        assert job.wait_until(lambda: "node1" in job.controller.dead, 10)
        time.sleep(1.0)  # cut for longer than the detection, shorter than the lease
        rig.heal(victim["i"])
        return rejoined

    def rejoined(job):
        """The node heard it is dead, its task failed, and its retry joined as a standby
        on the host it was on."""
        host = rig.hosts[victim["i"]].address
        c = job.controller
        assert job.wait_until(lambda: any(
            n.startswith("standby") and c.hosts.get(n) == host and n not in c.dead
            for n in c.registered), 60)

    # Silence is judged after 1 s here, as in the kill's test below: two cores run all
    # five hosts, and they starve whole processes for up to half a second (a CI run
    # declared node3 silent for 0.500 s at the 0.5 s default); the cut still lasts
    # longer than the detection and shorter than the 3 s lease
    output, expected, job = run_with_a_fault(rig, cut, detect_after=1.0)
    assert [wire_form(x) for x in output] == [wire_form(x) for x in expected]
    events = job.metrics.events
    detected = [d for _, what, d in events if what == "detected"]
    assert detected and detected[0].startswith("node1 (silent"), detected
    # no node holding a replica is suspected falsely; a standby that has just started (the
    # cut node's retry, importing and building its operators on a loaded machine) may be
    # silent for the 0.5 s of a detection once: it holds no replica, nothing is lost
    assert all(d.startswith("standby") for d in detected[1:]), detected
    # node1 is told to stop when it speaks again; a standby detected falsely (above) may
    # be told so too, even before it: only those two kinds
    zombies = [d for _, what, d in events if what == "zombie told to stop"]
    assert "node1" in zombies and all(d == "node1" or d.startswith("standby")
                                      for d in zombies), zombies
    assert not any(h.cut for h in rig.hosts)


@pytest.mark.timeout(400)
def test_a_host_killed_whole_is_masked(rig):
    killed: dict = {}

    def kill(job):
        killed["i"] = host_index(rig, job, "node2")
        rig.kill_host(killed["i"])
        return None

    try:
        # A host's kill is detected by its dropped connections, not by silence. Two cores
        # run all five hosts here, and they starve whole processes for up to half a
        # second (heartbeats seen leaving 0.3-0.5 s late, several nodes at once, 1 run in
        # 15 declared a live node dead at the 0.5 s default): silence is judged after 1 s
        # in this test, so what it checks is the kill's masking, not this machine's load.
        output, expected, job = run_with_a_fault(rig, kill, detect_after=1.0)
        assert [wire_form(x) for x in output] == [wire_form(x) for x in expected]
        timeline = "\n".join(f"{t:8.3f}s {what} {d}" for t, what, d in
                             job.metrics.relative_events())
        assert [d for _, what, d in job.metrics.events if what == "detected"] == [
            "node2 (its connection dropped)"], timeline
        assert rig.pids(killed["i"]) == []
    finally:
        if "i" in killed:
            rig.restart_worker(killed["i"])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("scenario", ["silent-host", "partition-heal"])
def test_a_chaos_run_of_each_scenario_of_hosts_changes_nothing_in_the_output(rig, scenario,
                                                                            tmp_path):
    from experiments.chaos import parse_args, run_one

    args = parse_args(["--hosts", str(HOSTS), "--scenarios", scenario, "--packets", "30000",
                       "--rate", "5000", "--out", str(tmp_path)])
    run = run_one(rig.spark, 8, args, rig)
    log = "\n".join(f"{t:8.3f}s {what} {detail}" for t, what, detail in run.events)
    assert run.ok, f"seed {run.seed} {run.scenario} {run.dataflow} {run.kills}: {run.why}\n{log}"
    assert run.scenario == scenario and run.kills and not any(h.cut for h in rig.hosts)


@pytest.mark.timeout(200)
def test_the_rig_leaves_nothing_behind_even_when_its_body_fails():
    from flux.testing.rig import Rig

    rig = Rig(1)
    with pytest.raises(RuntimeError, match="the body failed"):
        with rig:
            namespace, bridge = rig.hosts[0].namespace, rig.bridge
            pids = [rig.master.pid, rig.hosts[0].worker.pid]
            raise RuntimeError("the body failed")
    assert namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout
    assert bridge not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@pytest.mark.timeout(60)
def test_a_rig_takes_another_name_when_a_bridge_of_its_name_is_left_behind(monkeypatch):
    """A killed rig leaves its bridge; the next one whose process id ends the same must
    not fail on it (``RTNETLINK answers: File exists``)."""
    from flux.testing import rig as rigs

    stale = f"flxbr{os.getpid() % 10000:04d}00"
    subprocess.run(["ip", "link", "add", stale, "type", "bridge"], check=True)
    draws = iter([0, 0, 1])
    monkeypatch.setattr(rigs.random, "randrange", lambda n: next(draws))
    rig = rigs.Rig(1)
    try:
        rig._claim_bridge()
        assert rig.bridge == f"flxbr{os.getpid() % 10000:04d}01"
        assert rig.bridge in subprocess.run(["ip", "link"], capture_output=True,
                                            text=True).stdout
    finally:
        rig.close()
        subprocess.run(["ip", "link", "del", stale], check=False)
    assert rig.bridge not in subprocess.run(["ip", "link"], capture_output=True,
                                            text=True).stdout
