"""Flux for PySpark: highly available, partitioned, stateful dataflows on Spark.

What users import lives here::

    from flux import Dataflow, Stage, FluxJob, local_cluster

Every operator partition runs as a pair of replicas; the exchange between
stages is Flux (Shah, Hellerstein, Brewer, SIGMOD 2004), which masks the loss
of a replica and rebuilds it on a standby while the dataflow runs, with the
output exactly-once and in order.

The parts that open sockets or start Spark (``FluxJob``, ``local_cluster``,
sources, sinks, ``ThreadCluster``) are imported when first used, so that
``import flux`` stays free of ZeroMQ and Spark (the folder line of DESIGN 2).
"""
from __future__ import annotations

import importlib
from typing import Any

from flux.dataflow import Dataflow, Stage
from flux.connector_api import PartitionedSource, Sink, SinkPerPartition, Source, SplitSource
from flux.errors import (
    CheckpointCorrupt,
    CheckpointMismatch,
    RescaleRefused,
    DamagedFile,
    DataflowError,
    IngressLost,
    OperatorError,
    PairLost,
    ReplicasDiverged,
    SinkFenced,
    SourceOrderUnknown,
)
from flux.examples import paper_dataflow, vectorized_dataflow
from flux.expiry import Expiry
from flux.keyed_state import KeyedOperator, KeyedState
from flux.operator import (
    Filter,
    FlatMap,
    KeyedAggregate,
    Map,
    BatchOperator,
    Operator,
    keyed_state,
    keyed_table,
    tuplify,
)
from flux.examples.sessions import SessionReconstruction, session_key
from flux.examples.stats import WindowedDurationStats, stats_key
from flux.reference import reference_output

#: name -> the module that defines it, imported on first use (it does I/O)
_LAZY = {
    "FluxJob": "flux.spark.job",
    "Rebalance": "controller.rebalance",
    "Autoscale": "controller.autoscale",
    "lineage": "flux.runtime.lineage",
    "Lineage": "flux.runtime.lineage",
    "local_cluster": "flux.spark.session",
    "RateLimited": "flux.connectors.sources",
    "Paced": "flux.connectors.sources",
    "JsonLinesSink": "flux.connectors.sinks",
    "read_json_lines": "flux.connectors.sinks",
    "FileSource": "flux.connectors.file_source",
    "ListSplits": "flux.connectors.split_sources",
    "KafkaSplits": "flux.connectors.kafka_splits",
    "ParquetSource": "flux.connectors.parquet_source",
    "MapInPandas": "flux.pandas_map",
    "MapInArrow": "flux.pandas_map",
    "TransformWithStateInPandas": "flux.transform_with_state",
    "ColumnarKeyedState": "flux.columnar_state",
    "StatefulProcessor": "flux.stateful_processor",
    "StatefulProcessorHandle": "flux.stateful_processor",
    "FileSink": "flux.connectors.file_sink",
    "read_file_sink": "flux.connectors.file_sink",
    "DeltaSink": "flux.connectors.delta_sink",
    "read_delta_sink": "flux.connectors.delta_sink",
    "CheckpointStore": "flux.runtime.checkpoint_store",
    "KafkaSource": "flux.connectors.kafka_source",
    "KafkaSink": "flux.connectors.kafka_sink",
    "PartitionsChanged": "flux.connectors.kafka_source",
    "ThreadCluster": "flux.testing.threads",
    "packet_workload": "flux.testing.workloads",
    "keyed_workload": "flux.testing.workloads",
}

__all__ = [
    # the dataflow and its deployment
    "Dataflow", "Stage", "FluxJob", "local_cluster", "ThreadCluster", "Rebalance", "Autoscale",
    # operators: the contract, stateless helpers, keyed state, the paper's operators
    "Operator", "Map", "Filter", "FlatMap", "KeyedAggregate", "keyed_state", "keyed_table",
    "tuplify", "SessionReconstruction", "session_key", "WindowedDurationStats", "stats_key",
    "paper_dataflow", "vectorized_dataflow",
    # operators on Arrow batches: the contract, pandas and Arrow functions
    "BatchOperator", "MapInPandas", "MapInArrow", "TransformWithStateInPandas",
    "StatefulProcessor", "StatefulProcessorHandle", "ColumnarKeyedState",
    "KeyedState", "KeyedOperator", "Expiry",
    # sources, sinks, inputs and the failure-free reference
    "RateLimited", "JsonLinesSink", "read_json_lines", "packet_workload", "keyed_workload",
    "reference_output",
    # replayable sources, exactly-once sinks, checkpoints
    "Source", "Sink", "FileSource", "ParquetSource", "FileSink", "read_file_sink", "DeltaSink",
    "read_delta_sink", "CheckpointStore", "Paced", "PartitionedSource", "SinkPerPartition",
    # sources read by ingresses on the executors, split by split
    "SplitSource", "ListSplits", "KafkaSplits",
    # where an output came from
    "lineage", "Lineage",
    # Kafka in and out
    "KafkaSource", "KafkaSink", "PartitionsChanged",
    # errors users catch
    "DataflowError", "OperatorError", "PairLost", "ReplicasDiverged", "IngressLost", "SinkFenced",
    "CheckpointMismatch", "RescaleRefused", "CheckpointCorrupt", "DamagedFile",
    "SourceOrderUnknown",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flux' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
