"""What the driver knows of the ingresses on the executors (a ``flux.SplitSource``,
docs/design/parallel_io.md): no input passes through it, so it learns from their
reports when every split is read and the SN of each split's last input (the job's end
then waits for the outputs up to the highest), and counts the inputs from the nodes'
counters. It stands where the driver's feed stands for the end of the job
(``source_done``, ``read``), and with checkpoints has the pairs cut them
(``flux.spark.split_checkpoints``)."""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from pyspark import cloudpickle

from flux.connectors.sources import NOT_YET
from flux.control_messages import IngressEnded, NodeStats
from flux.sequence import EPOCH_INPUTS, epoch_at
from flux.spark.split_checkpoints import SplitCheckpoints
from flux.spark.verify_cuts import EpochVerifyCuts


class SplitWatch:
    """The splits' ends as reported (by the controller's thread), asked by the driver's;
    the checkpoints' cuts, or without checkpoints the verify cuts, when the job has them."""

    def __init__(self, splits: int, epoch_origin: float, epoch_interval: float,
                 cuts: Union[SplitCheckpoints, EpochVerifyCuts, None] = None):
        self.splits = splits
        self.cuts = cuts
        self.origin, self.interval = epoch_origin, epoch_interval
        #: split -> (its last input's SN, how many inputs it had), once read
        self.ends: Dict[int, Tuple[int, int]] = {}
        #: split -> the most inputs a replica of its pair reported taking
        self.taken: Dict[int, int] = {}
        self.stats = None  # the driver's own ingress has counters; these live on the nodes

    def report(self, msg) -> None:
        """A split read to its end (``IngressEnded``), or a pair past a cut."""
        if isinstance(msg, IngressEnded):
            self.ends[msg.split] = (msg.last, msg.inputs)
        elif self.cuts is not None:
            self.cuts.passed(msg)

    def turn(self, node_stats, metrics, tell: Callable[[Any], None]) -> None:
        """The controller's thread, each turn: the inputs the nodes counted, to the
        metrics; a cut when one is due (``tell``: to every node)."""
        taken = self.inputs_taken(node_stats)
        if taken is not None:
            metrics.inputs_counted(taken)
        if self.cuts is not None:
            self.cuts.maybe_cut_at_epoch(self.epoch_now(time.time()), tell,
                                         self.source_done)

    @property
    def source_done(self) -> bool:
        """Every split was read to its end."""
        return len(self.ends) >= self.splits

    @property
    def read(self) -> int:
        """The SN of the last input of all (meaningful once ``source_done``)."""
        return max((last for last, _ in dict(self.ends).values()), default=0)

    def epoch_now(self, wall: float) -> int:
        """The epoch the pairs' clock is in at wall-clock time ``wall``."""
        return epoch_at(wall, self.origin, self.interval)

    def input_time(self, sn: int) -> float:
        """When the epoch of input ``sn`` began (wall clock): at most an epoch before the
        ingress read it."""
        epoch = sn // (self.splits * EPOCH_INPUTS)
        return self.origin + epoch * self.interval

    def inputs_taken(self, node_stats: Mapping[str, Tuple[float, NodeStats]]) -> Optional[int]:
        """Inputs taken by the ingresses so far, per split the most either replica of its
        pair counted (a follower trails its leader; a rebuilt replica counts on from its
        twin's number, set back before the inputs that were pending), from the nodes'
        last counters; None before any node reported one."""
        for _, stats in list(node_stats.values()):
            for s in stats.segments:
                if s.addr.stage == 0:
                    self.taken[s.addr.partition] = max(self.taken.get(s.addr.partition, 0),
                                                       s.taken)
        for split, (_, inputs) in dict(self.ends).items():
            self.taken[split] = max(self.taken.get(split, 0), inputs)
        return sum(self.taken.values()) if self.taken else None


def check_split_job(source, options) -> int:
    """A ``SplitSource``'s job, checked before anything starts: how many splits. Refused
    with what is not built for it (its ingresses are pairs of Flux's replication:
    docs/design/parallel_io.md)."""
    splits = source.splits()
    if not isinstance(splits, int) or splits < 2:
        raise ValueError(f"a SplitSource has two or more splits, got {splits!r} from "
                         f"{type(source).__name__}.splits()")
    if options.replication.mode != "flux":
        raise ValueError(f"a SplitSource's splits are read by pairs of ingresses, which "
                         f"replication={options.replication.mode!r} does not have: use "
                         f"replication='flux'")
    try:
        cloudpickle.dumps(source)
    except Exception as exc:
        raise ValueError(f"a SplitSource is sent to the executors, and {type(source).__name__} "
                         f"cannot be pickled ({type(exc).__name__}: {exc}): hold what "
                         f"pickles (lists, paths, a bootstrap string), never a client") from exc
    return splits


def split_sample(source, n: int) -> list:
    """Up to ``n`` first inputs of split 0, for the checks before deploying (none:
    ``check_records=0`` leaves the checks out)."""
    read = itertools.takewhile(lambda item: item is not NOT_YET, source.read_split(0, 0))
    return list(itertools.islice(read, max(n, 0)))
