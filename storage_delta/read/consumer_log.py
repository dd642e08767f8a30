"""Rebuilding a consumer's state from its ack log rows: a pure reducer, no I/O.

The rows say what the consumer's state machine did (docs/storage.md, table ``acks``); replaying them
in lsn order gives back what JetStream persists for a consumer: the last delivered consumer and
stream sequences, the ack floor, the pending set with delivery counts, and the config (with its
``pause_until``). A ``state`` row (written by compaction) stands for everything at or below its
floor. Rows of an earlier consumer of the same name, or of a create whose catalog entry is not the
one being restored, are not replayed.

It lives here, beside the table it reduces, because both the gateway (restoring consumers at start)
and the ack-floor Spark job replay the log, and Spark jobs do not import the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage_delta.tables import acklog as al


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
    #: Where the consumer started (``start_after``) and the ``last_per_subject`` sequences it had
    #: still to deliver, as its create row recorded them.
    start_after: int = 0
    skip: list[int] = field(default_factory=list)
    delivered_cseq: int = 0
    delivered_sseq: int = 0
    delivered_ns: int = 0
    floor_cseq: int = 0
    floor_sseq: int = 0
    floor_ns: int = 0
    pending: dict[int, PendingState] = field(default_factory=dict)
    redelivered: set[int] = field(default_factory=set)

    @property
    def num_redelivered(self) -> int:
        return len(self.redelivered)

    @property
    def paused_until(self) -> str | None:
        return (self.config or {}).get("pause_until")


def _apply(state: ConsumerState, r: al.AckRecord) -> None:
    if r.kind == al.RESET:
        state.pending.clear()
        state.redelivered.clear()
    if r.kind in (al.CREATE, al.CONFIG, al.STATE, al.RESET):
        body = r.body_json()
        if body.get("config") is not None:
            state.config = body["config"]
        state.created_ns = int(body.get("created") or state.created_ns)
        state.start_after = int(body.get("start_after", state.start_after))
        state.skip = list(body.get("skip", state.skip))
        state.delivered_ns = max(state.delivered_ns, int(body.get("delivered_ts") or 0))
        state.floor_ns = max(state.floor_ns, int(body.get("ack_ts") or 0))
        state.redelivered |= set(body.get("redelivered") or ())
    if r.kind == al.DELIVER:
        state.delivered_ns = max(state.delivered_ns, r.ts)
        # a redelivery keeps the first delivery's consumer sequence (the floor moves by it)
        first = state.pending.get(r.seq)
        state.pending[r.seq] = PendingState(first.cseq if first else r.cseq, r.deliveries, r.ts)
    elif r.kind in (al.ACK, al.TERM, al.DROP):
        state.pending.pop(r.seq, None)
        if r.kind != al.DROP:
            state.floor_ns = max(state.floor_ns, r.ts)
    elif r.kind == al.NAK and r.seq in state.pending:
        state.pending[r.seq].due_ns = r.ts + int(r.body_json().get("delay") or 0)
    elif r.kind == al.WPI and r.seq in state.pending:
        state.pending[r.seq].since_ns = r.ts
    state.delivered_sseq, state.delivered_cseq = r.delivered_seq, r.delivered_cseq
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
    ack_all = (state.config or {}).get("ack_policy") == "all"
    state.redelivered = al.redelivered_after(
        [r for r in rows if r.kind != al.STATE], state.redelivered, ack_all
    )
    # Everything at or below the floor is acknowledged, whatever rows compaction folded.
    for seq in [s for s in state.pending if s <= state.floor_sseq]:
        del state.pending[seq]
    state.skip = [s for s in state.skip if s > state.delivered_sseq]
    return state
