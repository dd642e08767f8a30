"""A consumer's state machine: what to deliver next, what is pending, where the ack floor is.

No I/O: the gateway feeds it the stream's view and the clock, and carries out what it returns.
Numbers follow the real server's (consumer info shows the *last* delivered sequences, the ack
floor moves over acked prefixes only), see WIRE-NOTES.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.consumer_config import filters_of
from gateway.consumer_log import ConsumerState
from gateway.stream import Stream
from gateway.timefmt import rfc3339


@dataclass(slots=True)
class Pending:
    cseq: int
    deliveries: int
    deadline_ns: int


@dataclass(slots=True)
class PullRequest:
    """One ``CONSUMER.MSG.NEXT`` request waiting to be served."""

    reply: str
    batch: int
    max_bytes: int
    expires_at_ns: int  # 0: never
    no_wait: bool
    heartbeat_ns: int
    delivered: int = 0
    bytes_sent: int = 0
    next_heartbeat_ns: int = 0


@dataclass(slots=True)
class Delivery:
    """A message to send: to ``reply``'s inbox, under its stored subject, with this ack token."""

    inbox: str
    seq: int
    cseq: int
    deliveries: int
    pending: int


@dataclass(slots=True)
class Status:
    """A status message (header-only) for a pull request's inbox."""

    inbox: str
    code: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)


class PullRequestQueue:
    """Waiting pull requests, oldest first, bounded by ``max_waiting``."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._q: deque[PullRequest] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def full(self) -> bool:
        return len(self._q) >= self.max_waiting

    def push(self, req: PullRequest) -> None:
        self._q.append(req)

    def peek(self) -> PullRequest | None:
        return self._q[0] if self._q else None

    def pop(self) -> PullRequest:
        return self._q.popleft()

    def expire(self, now_ns: int) -> list[PullRequest]:
        gone = [r for r in self._q if r.expires_at_ns and r.expires_at_ns <= now_ns]
        if gone:
            self._q = deque(r for r in self._q if r not in gone)
        return gone

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._q)


class Consumer:
    def __init__(self, stream: Stream, config: dict[str, Any], created_ns: int) -> None:
        self.stream = stream
        self.config = config
        self.created_ns = created_ns
        self.filters = filters_of(config)
        self.dseq = 0  # last consumer sequence delivered
        self.sseq = 0  # last stream sequence delivered
        self.last_active_ns = 0
        self.ack_floor_cseq = 0
        self.ack_floor_sseq = 0
        self.ack_floor_active_ns = 0
        self.pending: dict[int, Pending] = {}
        self.redeliver: deque[int] = deque()
        self.waiting = PullRequestQueue(int(config.get("max_waiting") or 0))

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.config.get("durable_name"))

    @property
    def ack_none(self) -> bool:
        return self.config["ack_policy"] == "none"

    def num_pending(self) -> int:
        return self.stream.count_matching_after(self.sseq, self.filters)

    def num_redelivered(self) -> int:
        return sum(1 for p in self.pending.values() if p.deliveries > 1)

    def has_work(self) -> bool:
        if self.redeliver:
            return True
        return self.stream.next_matching(self.sseq, self.filters) is not None

    def at_ack_limit(self) -> bool:
        limit = int(self.config.get("max_ack_pending") or 0)
        return not self.ack_none and limit > 0 and len(self.pending) >= limit

    def next_delivery(self, now_ns: int) -> tuple[int, int, int] | None:
        """Take the next message to deliver: (stream seq, consumer seq, delivery count)."""
        while self.redeliver:
            seq = self.redeliver.popleft()
            p = self.pending.get(seq)
            if p is None:
                continue
            self.dseq += 1
            p.cseq = self.dseq
            p.deliveries += 1
            p.deadline_ns = now_ns + int(self.config["ack_wait"])
            self.last_active_ns = now_ns
            return seq, self.dseq, p.deliveries
        if self.at_ack_limit():
            return None
        seq = self.stream.next_matching(self.sseq, self.filters)
        if seq is None:
            return None
        self.dseq += 1
        self.sseq = seq
        self.last_active_ns = now_ns
        if self.ack_none:
            self.ack_floor_cseq, self.ack_floor_sseq = self.dseq, seq
        else:
            self.pending[seq] = Pending(self.dseq, 1, now_ns + int(self.config["ack_wait"]))
        return seq, self.dseq, 1

    def ack(self, seq: int, now_ns: int) -> bool:
        """A positive ack of a stream sequence; False when it was not pending (a late double ack)."""
        p = self.pending.pop(seq, None)
        if p is None:
            return False
        self.ack_floor_active_ns = now_ns
        if not self.pending:
            self.ack_floor_cseq, self.ack_floor_sseq = self.dseq, self.sseq
        elif seq < min(self.pending):
            # The floor moves over the acked prefix up to just below the oldest still pending.
            lowest = min(self.pending)
            self.ack_floor_sseq = lowest - 1
            self.ack_floor_cseq = self.pending[lowest].cseq - 1
        return True

    def nak(self, seq: int) -> None:
        if seq in self.pending and seq not in self.redeliver:
            self.redeliver.append(seq)

    def due_redeliveries(self, now_ns: int) -> bool:
        """Queue for redelivery every pending message whose ack wait ran out."""
        found = False
        for seq, p in sorted(self.pending.items()):
            if p.deadline_ns <= now_ns and seq not in self.redeliver:
                self.redeliver.append(seq)
                p.deadline_ns = now_ns + int(self.config["ack_wait"])
                found = True
        return found

    def restore(self, state: ConsumerState) -> None:
        """Take up the state the ack log rebuilt; a pending message's ack wait runs from its
        delivery (or last progress ack), a nak'd one is due when the nak said."""
        self.dseq, self.sseq, self.last_active_ns = (
            state.delivered_cseq,
            state.delivered_sseq,
            state.delivered_ns,
        )
        self.ack_floor_cseq, self.ack_floor_sseq = state.floor_cseq, state.floor_sseq
        self.ack_floor_active_ns = state.floor_ns
        wait = int(self.config["ack_wait"])
        self.pending = {
            seq: Pending(p.cseq, p.deliveries, p.due_ns if p.due_ns is not None else p.since_ns + wait)
            for seq, p in sorted(state.pending.items())
        }

    def info(self, stream_name: str, now_ns: int) -> dict[str, Any]:
        delivered: dict[str, Any] = {"consumer_seq": self.dseq, "stream_seq": self.sseq}
        if self.last_active_ns:
            delivered["last_active"] = rfc3339(self.last_active_ns)
        floor: dict[str, Any] = {"consumer_seq": self.ack_floor_cseq, "stream_seq": self.ack_floor_sseq}
        if self.ack_floor_active_ns:
            floor["last_active"] = rfc3339(self.ack_floor_active_ns)
        return {
            "stream_name": stream_name,
            "name": self.name,
            "created": rfc3339(self.created_ns),
            "config": self.config,
            "delivered": delivered,
            "ack_floor": floor,
            "num_ack_pending": len(self.pending),
            "num_redelivered": self.num_redelivered(),
            "num_waiting": len(self.waiting),
            "num_pending": self.num_pending(),
            "ts": rfc3339(now_ns),
        }
