"""Fixtures more than one test module uses."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def broker():
    """A real Kafka-protocol broker (noida-db) for the session's Kafka tests, stopped by its
    PID at the end; the tests that take it skip without confluent-kafka and noida-db."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("noida_db")
    from flux.runtime.kafka_broker import KafkaBroker

    b = KafkaBroker().start()
    try:
        yield b
    finally:
        b.stop()
