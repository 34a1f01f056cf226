"""The description of a linear partitioned dataflow, and its build-time checks.

A dataflow is a sequence of stages; in front of each stage a Flux
repartitions records on the stage's key. Operators are given as zero-arg
factories (a class, or a ``functools.partial`` of one) so every replica,
standby and check gets a fresh instance; keep keys and factories
module-level so they pickle to Spark executors.

Rejected when built (DESIGN 5): no stages, a key that is not callable, a
factory that does not give a fresh object with the operator API. What
needs records to find out (a state that does not round-trip, a batch method
that disagrees with its record method) is checked at deploy
(``flux.deploy_checks``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flux.errors import DataflowError
from flux.operator import OperatorChain, check_operator_api


def factory_name(factory: Any) -> str:
    """A readable name for an operator factory (class, function or partial)."""
    inner = getattr(factory, "func", factory)
    return getattr(inner, "__qualname__", None) or repr(factory)


@dataclass(frozen=True)
class Stage:
    """One stage: its input partition key and the factories of its operator chain."""

    name: str
    key: Callable[[Any], Any]
    operators: tuple[Callable[[], Any], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.operators, list):
            object.__setattr__(self, "operators", tuple(self.operators))

    def build_chain(self) -> OperatorChain:
        """A chain of fresh operators, one per factory."""
        return OperatorChain([factory() for factory in self.operators])


class Dataflow:
    """A linear pipeline of stages, validated when built."""

    def __init__(self, stages: Sequence[Stage]):
        self.stages: tuple[Stage, ...] = tuple(stages)
        if not self.stages:
            raise DataflowError("a dataflow needs at least one stage")
        names = set()
        for stage in self.stages:
            _check_stage(stage)
            if stage.name in names:
                raise DataflowError(f"two stages are named {stage.name!r}")
            names.add(stage.name)

    def __len__(self) -> int:
        return len(self.stages)

    def __repr__(self) -> str:
        return f"Dataflow({[stage.name for stage in self.stages]})"


def _check_stage(stage: Any) -> None:
    if not isinstance(stage, Stage):
        raise DataflowError(f"expected a Stage, got {stage!r}")
    if not isinstance(stage.name, str) or not stage.name:
        raise DataflowError(f"stage name must be a non-empty str, got {stage.name!r}")
    if not callable(stage.key):
        raise DataflowError(f"stage {stage.name!r}: key {stage.key!r} is not callable")
    if not isinstance(stage.operators, tuple):
        raise DataflowError(
            f"stage {stage.name!r}: operators must be a tuple of factories, "
            f"got {stage.operators!r}"
        )
    for i, factory in enumerate(stage.operators):
        where = f"stage {stage.name!r} operator {i} ({factory_name(factory)})"
        if not callable(factory):
            raise DataflowError(f"{where}: factory {factory!r} is not callable")
        try:
            first, second = factory(), factory()
        except Exception as exc:
            raise DataflowError(f"{where}: factory failed: {exc!r}") from exc
        check_operator_api(first, where)
        if first is second:
            # Replicas of a pair must never share state (DESIGN 1).
            raise DataflowError(f"{where}: factory returns the same object twice")
