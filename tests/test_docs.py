"""Every Python block of the README and of the pages under docs/ runs as a test, and every
relative link there points to a file (and heading) that exists.

- Quick: the blocks that start no Spark run as written, a page's blocks in order in one
  namespace, as a reader would paste them.
- Slow (Spark, one local cluster at a time): a block that starts one (``local_cluster(``)
  runs with the substitutions its page states: ``/data/`` becomes a temporary folder
  (holding the inputs the block reads) and ``broker:9092`` the test broker's address; its
  output is compared with the failure-free output. The README's first block is
  tests/test_readme.py's.
"""
from __future__ import annotations

import json
import pathlib
import re
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README] + sorted(DOCS.rglob("*.md"))
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks(page: pathlib.Path) -> list:
    return PYTHON_BLOCK.findall(page.read_text())


def needs_spark(block: str) -> bool:
    return "local_cluster(" in block or "getOrCreate()" in block


RUNNABLE = [p for p in PAGES if any(not needs_spark(b) for b in python_blocks(p))]


def runs_a_cluster(page: pathlib.Path) -> bool:
    """A page whose blocks start a thread cluster: tens of seconds (CI, not the quick
    suite)."""
    return any("ThreadCluster(" in b for b in python_blocks(page) if not needs_spark(b))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if runs_a_cluster(p) else p for p in RUNNABLE],
    ids=[name(p) for p in RUNNABLE])
def test_every_python_block_without_spark_runs_as_written(page):
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    for i, block in enumerate(python_blocks(page)):
        if not needs_spark(block):
            exec(compile(block, f"{name(page)} block {i + 1}", "exec"), namespace)


def test_the_docs_have_python_blocks_to_run():
    assert any(python_blocks(p) for p in PAGES if p != README), \
        "no page under docs/ has a python block: the tests above run nothing"


# -- the blocks that start Spark: each has a slow test below ----------------------------------

#: (page, a string only that block holds) -> the slow test that runs it
SPARK_BLOCKS = {
    ("README.md", "job.kill_node(\"node1\")"): "tests/test_readme.py",
    ("docs/api.md", "format=\"parquet\"),"): "test_the_resumable_file_job_runs",
    ("docs/api.md", "KafkaSource(\"broker:9092\""): "test_the_kafka_job_runs",
    ("docs/api.md", "SinkPerPartition(lambda p"): "test_the_job_with_a_sink_per_partition_runs",
    ("docs/operations.md", "getOrCreate()"): "tests/test_walkthrough.py",
}


def spark_block(page: str, marker: str) -> str:
    found = [b for b in python_blocks(ROOT / page) if marker in b]
    assert len(found) == 1, f"{page} has {len(found)} python blocks with {marker!r}"
    assert needs_spark(found[0])
    return found[0]


def test_every_block_that_starts_spark_has_its_slow_test():
    spark = {(name(p), i) for p in PAGES for i, b in enumerate(python_blocks(p))
             if needs_spark(b)}
    covered = set()
    for page, marker in SPARK_BLOCKS:
        block = spark_block(page, marker)
        covered.add((page, python_blocks(ROOT / page).index(block)))
    assert spark == covered, f"blocks that start Spark without a test: {spark - covered}"
    assert python_blocks(README)[0] == spark_block("README.md", "job.kill_node(\"node1\")")


def run_with(block: str, substitutions: dict, label: str) -> dict:
    for old, new in substitutions.items():
        assert old in block, (label, old)
        block = block.replace(old, new)
    namespace: dict = {"__name__": "docs_block"}
    exec(compile(block, label, "exec"), namespace)
    return namespace


def packets_as_json(n: int) -> list:
    from flux import packet_workload

    return [json.loads(json.dumps(p)) for p in packet_workload(n, seed=3, pairs=2_000,
                                                                apps=10, sources=200)]


def failure_free(records: list) -> list:
    from flux import paper_dataflow, reference_output
    from flux.operator import wire_form

    return [wire_form(r) for _, r in reference_output(paper_dataflow(), records, 4)]


def run_on_packet_files(tmp_path, marker: str, files: int = 4):
    """The paper's packets as JSON-lines files in ``/data/packets``, and the api.md block
    holding ``marker`` run over them (``/data/`` a temporary folder)."""
    packets = packets_as_json(20_000)
    folder = tmp_path / "packets"
    folder.mkdir()
    per = -(-len(packets) // files)
    for i in range(files):
        with open(folder / f"part-{i}.jsonl", "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in packets[i * per:(i + 1) * per])
    namespace = run_with(spark_block("docs/api.md", marker), {"/data/": f"{tmp_path}/"},
                         f"docs/api.md ({marker})")
    return packets, namespace


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_resumable_file_job_runs(tmp_path):
    from flux import read_file_sink
    from flux.operator import wire_form

    packets, namespace = run_on_packet_files(tmp_path, "format=\"parquet\"),")
    assert namespace["job"].resumed_from is None
    written = read_file_sink(str(tmp_path / "stats"))
    assert [wire_form(r) for _, r in written] == failure_free(packets)
    assert len(written) > 1_000




@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_job_with_a_sink_per_partition_runs(tmp_path):
    from flux.operator import wire_form

    packets, namespace = run_on_packet_files(tmp_path, "SinkPerPartition(lambda p")
    parts = namespace["parts"]
    assert all(parts)  # every partition had outputs of its own
    for part in parts:
        assert [sn for sn, _ in part] == sorted({sn for sn, _ in part})
    merged = sorted(row for part in parts for row in part)
    assert [wire_form(r) for _, r in merged] == failure_free(packets)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_kafka_job_runs(broker, tmp_path):
    from confluent_kafka import Producer

    from experiments.kafka_io import read_output

    for topic in ("packets", "stats"):
        assert broker.partitions(topic) == 0, f"the test broker already has {topic!r}"
        broker.create_topic(topic, 1)  # one partition: the job reads the packets in order
    packets = packets_as_json(20_000)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for p in packets:
        producer.produce("packets", json.dumps(p).encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    run_with(spark_block("docs/api.md", "KafkaSource(\"broker:9092\""),
             {"broker:9092": broker.bootstrap, "/data/": f"{tmp_path}/{uuid.uuid4().hex}/"},
             "docs/api.md (Kafka)")
    assert read_output(broker.bootstrap, "stats") == failure_free(packets)


# -- links ------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code (no links or headings there)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(page: pathlib.Path) -> set:
    """The anchors GitHub gives the headings of ``page``."""
    seen: dict = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[name(p) for p in PAGES])
def test_every_relative_link_points_to_a_file_that_exists(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file {where}")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {name(where)}")
    assert not broken, f"{name(page)}: " + "; ".join(broken)


def test_no_page_names_a_ticket():
    """Pages give the reason itself, or link the page that explains it."""
    for page in PAGES:
        assert not re.search(r"issue [0-9]", page.read_text()), name(page)
