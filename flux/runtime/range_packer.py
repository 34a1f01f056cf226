"""A node packs a live move's bulk off its loop's thread (DESIGN 13).

A prepare's bulk may be megabytes; packed on the loop it would hold the partition up
for the packing (and more, waiting for a core, on a busy machine). The values it holds
are the stores' own, which they replace and never change in place, so another thread
may pack them while the loop runs on: ``flux.state_codec`` packs in slices and lets the
loop's thread take the interpreter between them. One short-lived thread per bulk (a
move is rare); the loop collects what is packed at every turn (``finished``).
"""
from __future__ import annotations

import threading
from typing import List, Optional, Tuple

from flux.control_messages import RangePacked
from flux.effects import PackRange
from flux.errors import OperatorError
from flux.operator import describe
from flux.state_codec import pack_state


class RangePacker:
    """Bulks being packed, and those packed and not yet collected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: List[Tuple[PackRange, float, Optional[bytes], Optional[Exception]]] = []
        self._threads: List[threading.Thread] = []

    def pack(self, e: PackRange, took: float) -> None:
        """Pack ``e``'s bulk on a thread; ``took``: the seconds of the step that kept it."""
        thread = threading.Thread(target=self._run, args=(e, took), daemon=True,
                                  name=f"range-pack-{e.addr}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _run(self, e: PackRange, took: float) -> None:
        data, error = None, None
        try:
            data = pack_state(e.parts)
        except Exception as exc:  # the operator's, named on the loop's thread
            error = exc
        with self._lock:
            self._done.append((e, took, data, error))

    def finished(self) -> List[RangePacked]:
        """The bulks packed since the last call; an ``OperatorError`` if one could not be."""
        with self._lock:
            done, self._done = self._done, []
        out = []
        for e, took, data, error in done:
            if error is not None:
                m = e.move
                raise OperatorError(f"the bulk of the live move of key groups "
                                    f"{m.first}..{m.last} to partition {m.dest}", m.stage,
                                    m.source, (), f"cannot be encoded: {describe(error)}")
            out.append(RangePacked(e.number, e.move, e.addr, data, None, took))
        return out

    def busy(self) -> bool:
        return any(t.is_alive() for t in self._threads)
