"""The driver's ingress: its process, and the thread that reads the job's source and
feeds it (DESIGN 4.7). A job whose source is a ``flux.SplitSource`` has none: its
ingresses run on the executors (``flux.runtime.node_ingresses``)."""
from __future__ import annotations

from flux.connector_api import OffsetReporting
from flux.runtime.ingress_feed import IngressFeed
from flux.runtime.ingress_process import BEGIN, IngressProcess
from flux.spark.verify_cuts import VerifyCuts


def start_ingress_process(parts, inc: int, config) -> IngressProcess:
    """The ingress's process, started first in an attempt (it imports while the driver's
    sockets open), as ``config`` says (the job's, with the attempt's ``group_maps``)."""
    return IngressProcess(dict(
        dataflow=config.dataflow, partitions=config.partitions, capacity=config.capacity,
        batch_size=config.batch_size, replication=config.replication,
        window=config.window, batch_rows=config.batch_rows, pause_room=config.pause_room,
        key_groups=config.key_groups, inc=inc, host=parts.driver_host,
        keys=config.keys, ports=config.ports, flush_delay=config.flush_delay,
        item_delay=config.item_delay, groups=config.group_maps,
        dormant=sorted(config.dormant)))


def start_feed(parts, process: IngressProcess, controller, topology) -> IngressFeed:
    """The data starts: the process learns where everyone is and the input to number
    from (a restart's checkpoint), and the feed reads the source from there."""
    accepted, logged_before, log_writer = 0, 0, None
    if parts.checkpoints is not None:
        accepted, logged_before, log_writer = parts.checkpoints.open_source(
            parts.metrics.events)
        parts.metrics.renumber(accepted)
    process.send(BEGIN, dict(
        where=topology.where, addresses=dict(controller.addresses),
        incarnations=dict(controller.incarnations), peer_incs=topology.peer_incs(),
        accepted=accepted))
    return IngressFeed(process, iter(parts.source), parts.metrics, accepted,
                       input_log=log_writer, logged_before=logged_before)


def feed_ingress(parts, feed: IngressFeed, stop) -> None:
    """The source's thread: read it, feed the ingress process, choose the cuts."""
    source = parts.source
    report = source.commit_offsets if isinstance(source, OffsetReporting) else None
    # the checkpoints' cuts, or without them cuts for the pairs' digests (DESIGN 14)
    cuts = parts.checkpoints or (VerifyCuts(parts.verify_interval)
                                 if parts.verify_interval else None)
    try:
        while not stop.is_set():
            feed.step(5)
            if cuts is not None:
                cuts.maybe_cut(feed)
                cuts.report_offsets(report)
    finally:
        feed.process.stop()
