"""Sources and sinks: what the runtime reads inputs from and writes outputs to.

``capabilities`` says what a source or sink promises (the protocols the runtime
relies on, no probing); the other modules are the connectors themselves (files,
Delta, Kafka, sequences, callables). They are imported one by one, where used,
so that ``import flux`` loads neither Kafka nor Delta.
"""
from flux.connector_api import (
    BY_POSITION, LOGGED, REPLAY_ORDERS, ClosingSink, CommitsBySN, DroppingSource,
    OffsetReporting, PartitionedSource, Sink, SinkPerPartition, Source, SplitSource, TimedSource,
    WaitingSource,
    describe_source, is_exactly_once, replay_order_of,
)

__all__ = [
    "BY_POSITION", "LOGGED", "REPLAY_ORDERS", "ClosingSink", "CommitsBySN", "DroppingSource",
    "OffsetReporting", "PartitionedSource", "Sink", "SinkPerPartition", "Source", "SplitSource",
    "TimedSource",
    "WaitingSource", "describe_source",
    "is_exactly_once", "replay_order_of",
]
