"""Fixtures more than one test module uses."""
from __future__ import annotations

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


@pytest.fixture(scope="module")
def spark(request):
    """One embedded ``local-cluster`` Spark session per test module, stopped after its last
    test: ``SPARK_EXECUTORS`` of the module executors (6 by default: 4 nodes, a standby
    and a warm spare). Never two at once: the Spark tests run without ``-n``."""
    from flux.spark.session import local_cluster

    with local_cluster(getattr(request.module, "SPARK_EXECUTORS", 6)) as session:
        yield session


@pytest.fixture
def zmq_ctx():
    """A ZeroMQ context for one test: after it, every socket still open is closed at linger
    0 and the context ends, so a test that failed half-way leaves no socket behind and no
    teardown hangs in ``term()``."""
    import zmq

    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
