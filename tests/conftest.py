"""Fixtures more than one test module uses."""
from __future__ import annotations

import time

import pytest


@pytest.fixture(scope="module")
def broker():
    """A real Kafka-protocol broker (noida-db) for a test module's Kafka tests, stopped by
    its PID after the module's last test; the tests that take it skip without
    confluent-kafka and noida-db. Per module, not per session: an idle broker holding the
    topics of earlier modules takes a third of a core, and the rig's no-false-detection
    tests later in the run do not get it back."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("noida_db")
    from flux.testing.kafka_broker import KafkaBroker

    b = KafkaBroker().start()
    try:
        yield b
    finally:
        b.stop()


#: the embedded cluster the ``spark`` fixture hands out: its executor count, its context
#: manager and session (one at a time; stopped before any test that does not take it)
_SHARED: dict = {"executors": None, "cm": None, "session": None}


def _executors(item) -> int:
    module = getattr(item, "module", None)
    return getattr(module, "SPARK_EXECUTORS", 6)


def _takes_spark(item) -> bool:
    return "spark" in getattr(item, "fixturenames", ())


def _stop_shared() -> None:
    cm = _SHARED["cm"]
    if cm is not None:
        _SHARED.update(executors=None, cm=None, session=None)
        cm.__exit__(None, None, None)


def pytest_collection_modifyitems(session, config, items):
    """The tests that take the ``spark`` fixture run last, those of one executor count
    together (in their modules' order otherwise): a cluster starts once per count, not
    once per module (each start costs 20-35 s here)."""
    spark = sorted((i for i in items if _takes_spark(i)), key=_executors)
    items[:] = [i for i in items if not _takes_spark(i)] + spark


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed Spark test's report carries what its executors wrote (their warnings, a
    hard crash's traceback): a failure seen once in many runs is understood from it."""
    outcome = yield
    report = outcome.get_result()
    session = _SHARED["session"]
    if report.when == "call" and report.failed and _takes_spark(item) and session is not None:
        from flux.testing.executor_logs import executor_log_tails

        tails = executor_log_tails(session.sparkContext.applicationId)
        if tails:
            report.sections.append(("executors' stderr", tails))


def pytest_runtest_setup(item):
    """Never two clusters at once: a test that does not take the shared one (a rig, a
    cluster of its own, an experiment's) runs with none."""
    if not _takes_spark(item):
        _stop_shared()


def pytest_sessionfinish(session, exitstatus):
    _stop_shared()


@pytest.fixture
def spark(request):
    """An embedded ``local-cluster`` Spark session of ``SPARK_EXECUTORS`` of the test's
    module executors (6 by default: 4 nodes, a standby and a warm spare), shared by the
    tests of one count that run one after the other (``pytest_collection_modifyitems``)
    and stopped before any other test and at the end. A test that killed executors leaves
    them to Spark to start again: the next test waits until all are back. Never two at
    once: the Spark tests run without ``-n``."""
    from flux.spark.session import executor_count, local_cluster

    executors = _executors(request.node)
    if _SHARED["executors"] != executors:
        _stop_shared()
        cm = local_cluster(executors)
        session = cm.__enter__()
        _SHARED.update(executors=executors, cm=cm, session=session)
    session = _SHARED["session"]
    deadline = time.monotonic() + 120
    while executor_count(session.sparkContext) < executors:
        assert time.monotonic() < deadline, f"only {executor_count(session.sparkContext)} " \
            f"of {executors} executors came back"
        time.sleep(0.2)
    return session


@pytest.fixture
def zmq_ctx():
    """A ZeroMQ context for one test: after it, every socket still open is closed at linger
    0 and the context ends, so a test that failed half-way leaves no socket behind and no
    teardown hangs in ``term()``."""
    import zmq

    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
