"""Rebuilding a consumer's state from its ack log rows: a pure reducer, no I/O.

The rows say what the consumer's state machine did (docs/storage.md, table ``acks``); replaying them
in lsn order gives back what JetStream persists for a consumer: the last delivered consumer and
stream sequences, the ack floor, the pending set with delivery counts, and the config (with its
``pause_until``). A ``state`` row (written by compaction) stands for everything at or below its
floor. Rows of an earlier consumer of the same name, or of a create whose catalog entry is not the
one being restored, are not replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage_delta import acklog as al


@dataclass(slots=True)
class PendingState:
    """A delivered, unacknowledged message. ``since_ns`` starts its ack wait (the delivery or the
    last progress ack); ``due_ns`` is set when a nak asked for redelivery at that time."""

    cseq: int
    deliveries: int
    since_ns: int
    due_ns: int | None = None


@dataclass(slots=True)
class ConsumerState:
    created_ns: int = 0
    config: dict[str, Any] | None = None
    delivered_cseq: int = 0
    delivered_sseq: int = 0
    delivered_ns: int = 0
    floor_cseq: int = 0
    floor_sseq: int = 0
    floor_ns: int = 0
    pending: dict[int, PendingState] = field(default_factory=dict)

    @property
    def num_redelivered(self) -> int:
        return sum(1 for p in self.pending.values() if p.deliveries > 1)

    @property
    def paused_until(self) -> str | None:
        return (self.config or {}).get("pause_until")


def _apply(state: ConsumerState, r: al.AckRecord) -> None:
    if r.kind in (al.CREATE, al.CONFIG, al.STATE):
        body = r.body_json()
        if body.get("config") is not None:
            state.config = body["config"]
        if r.kind != al.CONFIG:
            state.created_ns = int(body.get("created") or state.created_ns)
            state.delivered_ns = max(state.delivered_ns, int(body.get("delivered_ts") or 0))
            state.floor_ns = max(state.floor_ns, int(body.get("ack_ts") or 0))
    if r.kind in (al.DELIVER, al.STATE):
        state.delivered_cseq = max(state.delivered_cseq, r.cseq)
        state.delivered_sseq = max(state.delivered_sseq, r.seq)
    if r.kind == al.DELIVER:
        state.delivered_ns = max(state.delivered_ns, r.ts)
        state.pending[r.seq] = PendingState(r.cseq, r.deliveries, r.ts)
    elif r.kind in (al.ACK, al.TERM, al.DROP):
        state.pending.pop(r.seq, None)
        if r.kind != al.DROP:
            state.floor_ns = max(state.floor_ns, r.ts)
    elif r.kind == al.NAK and r.seq in state.pending:
        state.pending[r.seq].due_ns = r.ts + int(r.body_json().get("delay") or 0)
    elif r.kind == al.WPI and r.seq in state.pending:
        state.pending[r.seq].since_ns = r.ts
    state.floor_sseq, state.floor_cseq = r.floor_seq, r.floor_cseq


def reduce(records: list[al.AckRecord], created_ns: int) -> ConsumerState:
    """The state of the consumer created at ``created_ns`` from its rows (lsn order). A log whose
    current incarnation belongs to another creation (a create row a crash cut off) gives a fresh
    state: nothing of the earlier consumer leaks into the new one."""
    rows = al.incarnation(records)
    state = ConsumerState()
    for r in rows:
        _apply(state, r)
    if state.created_ns != created_ns:
        return ConsumerState(created_ns=created_ns)
    # Everything at or below the floor is acknowledged, whatever rows compaction folded.
    for seq in [s for s in state.pending if s <= state.floor_sseq]:
        del state.pending[seq]
    return state
