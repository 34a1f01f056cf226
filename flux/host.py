"""The protocol machines of one process, and the view they have applied.

A node process hosts segments; the ingress and the egress are processes of
their own. The host applies controller views in order, holds a message from a
later view until that view is applied, and drops every message from an
endpoint a view declared dead (fencing, DESIGN 4.4). Sans-I/O: it returns
envelopes to send; the simulator or the runtime carries them.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

from flux.messages import Addr, Envelope, ProtocolError, Send, View


class Host:
    """Dispatches envelopes and views to the machines of one process."""

    def __init__(self, name: str, machines: Dict[Addr, object]):
        self.name = name
        self.machines = dict(machines)
        self.view = 0
        self.dead: Set[Addr] = set()

    def accepts(self, env: Envelope) -> bool:
        """A message from a view this host has not applied yet must wait (DESIGN 4.4)."""
        return env.view <= self.view

    def fenced(self, env: Envelope) -> bool:
        return env.src in self.dead

    def on_envelope(self, env: Envelope) -> Tuple[List[Envelope], List]:
        """Deliver one message; returns (envelopes to send, other effects)."""
        if not self.accepts(env):
            raise ProtocolError(f"{self.name}: message from view {env.view} before it was applied")
        if self.fenced(env):
            return [], []
        machine = self.machines.get(env.dst)
        if machine is None:
            raise ProtocolError(f"{self.name}: no endpoint {env.dst} here (from {env.src})")
        return self.wrap(machine.on_message(env.src, env.msg))

    def on_view(self, view: View) -> Tuple[List[Envelope], List]:
        """Apply a view: every machine handles fail() before anything else happens."""
        if view.number != self.view + 1:
            raise ProtocolError(f"{self.name}: view {view.number} after view {self.view}")
        self.view = view.number
        self.dead |= set(view.failed)
        effects: List = []
        for addr, machine in self.machines.items():
            if addr not in view.failed:
                effects.extend(machine.on_fail(set(view.failed)))
        return self.wrap(effects)

    def wrap(self, effects) -> Tuple[List[Envelope], List]:
        sends, others = [], []
        for e in effects:
            if isinstance(e, Send):
                sends.append(Envelope(e.src, e.dst, self.view, e.msg))
            else:
                others.append(e)
        return sends, others
