"""A consumer's state machine: what to deliver next, what is pending, where the ack floor is.

No I/O: the gateway feeds it the stream's view and the clock, and carries out what it returns.
Every change is one method call (``deliver``, ``ack``, ``nak``, ``progress``, ``term``,
``expire``), so a recorder (the Delta ack log) can follow each transition.

Numbers follow the real server (``server/consumer.go``), see docs/wire-notes.md: info shows the *last*
delivered sequences; an explicit ack moves the floor only when it acks the delivery right above
it (or empties the pending set), a redelivered message counting by the consumer sequence of its
first delivery (the server's pending record keeps it); ``max_deliver`` running out drops the
message from pending without moving the floor. ``num_pending`` is kept incrementally: the
stream's new messages are counted once, as the consumer catches up with them, never recounted per
delivery.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from gateway.api.configs import ConsumerConfig
from gateway.api.consumer_config import parse_time_ns
from gateway.api.pull import PullRequest
from gateway.api.responses import ConsumerInfo, PriorityGroupState, SequenceInfo
from gateway.api.timefmt import rfc3339
from gateway.engine.stream import Stream
from storage_delta.commit.writer import StoredMessage
from storage_delta.format.nats import subject_matches
from storage_delta.read.consumer_log import ConsumerState, PendingState


@dataclass(slots=True)
class Pending:
    """A delivered, not yet acknowledged message (keyed by stream sequence). ``cseq`` is its first
    delivery's consumer sequence: the ack floor moves by it, also after redeliveries."""

    cseq: int
    deliveries: int
    deadline_ns: int
    sent_ns: int = 0


@dataclass(slots=True)
class Watch:
    """What the consumer's timer knows of its listeners: when a push consumer's deliver subject
    last heard from it, when it last had interest or a request (None: not yet looked at), and
    whether it was listening when last looked at, so the moment it stops is when
    ``inactive_threshold`` starts counting."""

    last_sent_ns: int | None = None
    last_seen_ns: int | None = None
    listening: bool = False


class Delivered(NamedTuple):
    """What ``deliver`` decided: the ack token's numbers for one message, and the consumer's
    positions right after it, which its ack log row carries (a tuple: one is made per delivery)."""

    seq: int
    cseq: int
    deliveries: int
    pending: int
    sseq: int  # last delivered stream sequence
    floor_sseq: int
    floor_cseq: int


@dataclass(slots=True)
class Pin:
    """A ``pinned_client`` consumer's pin (ADR-42): the id its holder names in its pulls, the group
    it was given in, when, and when it lapses unless the holder pulls again. Kept in memory only,
    as the server keeps it: a restart starts without one."""

    id: str
    group: str
    since_ns: int
    expires_ns: int
    #: the request it was given to (which gives it back if its first message is too big for it)
    taker: PullRequest | None = None


#: Where a request without a priority group queues on a ``prioritized`` consumer: last.
LOWEST_PRIORITY = 2**31 - 1


class PullRequestQueue:
    """Waiting pull requests, oldest first, bounded by ``max_waiting``; on a ``prioritized``
    consumer, by priority (0 first), oldest first within one."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._q: deque[PullRequest] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def full(self) -> bool:
        return len(self._q) >= self.max_waiting

    def push(self, req: PullRequest) -> None:
        self._q.append(req)

    def push_prioritized(self, req: PullRequest) -> None:
        """Behind every request of the same or a higher priority (a lower number)."""
        rank = _rank(req)
        q = self._q
        at = len(q)
        while at and _rank(q[at - 1]) > rank:
            at -= 1
        q.insert(at, req)

    def peek(self) -> PullRequest | None:
        return self._q[0] if self._q else None

    def pop(self) -> PullRequest:
        return self._q.popleft()

    def requeue(self, req: PullRequest) -> None:
        """``req`` goes behind the others of its priority (``prioritized``: they take turns)."""
        self.finish(req)
        self.push_prioritized(req)

    def holds(self, req: PullRequest) -> bool:
        q = self._q
        return bool(q) and (q[0] is req or any(r is req for r in q))

    def finish(self, req: PullRequest) -> None:
        """``req`` leaves the queue (served in full, or refused), wherever it stands."""
        if self._q and self._q[0] is req:
            self._q.popleft()
        else:
            self.remove_where([req])

    def remove_where(self, gone: list[PullRequest]) -> None:
        if gone:
            ids = {id(r) for r in gone}
            self._q = deque(r for r in self._q if id(r) not in ids)

    def expire(self, now_ns: int) -> list[PullRequest]:
        gone = [r for r in self._q if r.expires_at_ns and r.expires_at_ns <= now_ns]
        self.remove_where(gone)
        return gone

    def expire_head(self, now_ns: int) -> list[PullRequest]:
        """The expired requests at the front, removed: delivery only ever serves the oldest, so a
        request whose time ran out between two sweeps of the timer is never served (the server
        checks a request's expiry when it serves it, too)."""
        gone = []
        q = self._q
        while q and q[0].expires_at_ns and q[0].expires_at_ns <= now_ns:
            gone.append(q.popleft())
        return gone

    def live(self, now_ns: int) -> int:
        """How many requests have time left (``num_waiting``: an expired one the timer has not
        swept yet is not waiting any more)."""
        return sum(1 for r in self._q if not r.expires_at_ns or r.expires_at_ns > now_ns)

    def clear(self) -> list[PullRequest]:
        gone = list(self._q)
        self._q.clear()
        return gone

    def __iter__(self) -> Iterator[PullRequest]:
        return iter(self._q)


def _rank(req: PullRequest) -> int:
    pg = req.priority_group
    return LOWEST_PRIORITY if pg is None else pg.priority


def start_position(stream: Stream, cfg: ConsumerConfig, time_seq: int | None) -> tuple[int, list[int]]:
    """Where a new consumer starts: the stream sequence it counts as already passed, and (for
    ``last_per_subject``) the sequences to deliver before resuming after that point.
    ``time_seq`` is the first sequence at or after ``opt_start_time`` (found by the caller)."""
    start, skip = _requested_start(stream, cfg, time_seq)
    # a start below the stream's first sequence (a purge, a config's ``first_seq``) is moved up
    # to it, as the server does: the sequences below count as passed, delivered and ack floor too
    return max(start, stream.state.first_seq - 1), skip


def _requested_start(stream: Stream, cfg: ConsumerConfig, time_seq: int | None) -> tuple[int, list[int]]:
    policy = cfg.deliver_policy
    filters = cfg.filters
    last = stream.state.last_seq
    if policy == "new":
        return last, []
    if policy == "last":
        found = stream.last_matching(filters)
        return (found - 1 if found else last), []
    if policy == "by_start_sequence":
        return max(cfg.opt_start_seq - 1, 0), []
    if policy == "by_start_time":
        return ((time_seq or last + 1) - 1), []
    if policy == "last_per_subject":
        return last, stream.last_per_subject(filters)
    return 0, []


def reset_refusal(cfg: ConsumerConfig, seq: int, time_seq: int | None) -> str | None:
    """Why ``CONSUMER.RESET`` to ``seq`` (not 0, which goes back above the ack floor under any
    policy) is refused, as the server words it: a bounded start may not be undercut, and the
    policies that start from the stream's end cannot be moved at all. ``time_seq`` is the first
    sequence at or after ``opt_start_time`` (found by the caller, as for ``start_position``)."""
    policy = cfg.deliver_policy
    if policy == "all":
        return None
    if policy == "by_start_sequence":
        return "below start seq" if seq < cfg.opt_start_seq else None
    if policy == "by_start_time":
        return "below start time" if time_seq is not None and seq < time_seq else None
    return "not allowed"


class Consumer:
    def __init__(
        self,
        stream: Stream,
        config: ConsumerConfig,
        created_ns: int,
        start_after: int = 0,
        skip: list[int] | None = None,
        name: str | None = None,
    ) -> None:
        self.stream = stream
        self.name = name or config.name or config.durable_name
        self._configure(config)
        self.created_ns = created_ns
        self.filters = config.filters
        # The cursor: the next matching live sequence above ``sseq`` the last search found (0:
        # none), and how far that search looked. Deliveries move past it, deletes make it dead,
        # new messages extend the search from ``_scanned``; a filter change or reset clears it.
        self._cursor = 0
        self._scanned = 0
        self.dseq = 0  # last consumer sequence delivered
        # last stream sequence passed by new deliveries; a skip list is served before resuming
        self.sseq = skip[0] - 1 if skip else start_after
        self._resume = start_after
        self.last_active_ns = 0
        self.ack_floor_cseq = 0
        self.ack_floor_sseq = self.sseq
        self.ack_floor_active_ns = 0
        self.pending: dict[int, Pending] = {}
        # Pending sequences in delivery order (ascending), lazily trimmed: the lowest pending one
        # in O(1) amortized (iterating a dict whose front was deleted is O(deleted)).
        self._order: deque[int] = deque()
        self.redeliver: deque[int] = deque()
        self._queued: set[int] = set()
        self._redelivered: set[int] = set()  # like the server's rdc: kept past max_deliver
        self._deadlines: list[tuple[int, int]] = []  # (deadline ns, stream seq), lazily invalidated
        self._skip: deque[int] = deque(skip or [])
        self._npc = 0  # matching messages in (sseq, _counted]
        self._counted = start_after
        self._match_cache: dict[str, bool] = {}
        self.waiting = PullRequestQueue(config.max_waiting)
        self.paused_until_ns = _pause_ns(config)
        self.watch = Watch()
        self.pin: Pin | None = None

    # ---- properties ---------------------------------------------------------------------------

    def _configure(self, config: ConsumerConfig) -> None:
        """The settings every delivery and ack consults, read once per config rather than per
        message."""
        self.config = config
        self.ack_policy = config.ack_policy
        self.ack_none = self.ack_policy == "none"
        #: ``flow_control`` acks as ``all`` does, by the answers to its flow-control requests
        self.ack_all = self.ack_policy in ("all", "flow_control")
        #: whether acks reach it: the server subscribes to a consumer's ack subject only then
        self.takes_acks = self.ack_policy in ("explicit", "all")
        #: whether a delivery waits for its ack with a deadline: not under ``flow_control``,
        #: whose ``ack_wait`` is 0 (the server runs no redelivery timer for it)
        self._timed = self.ack_policy != "flow_control"
        self.is_push = config.is_push
        self.max_deliver = config.max_deliver or -1
        self._backoff = config.backoff
        self._ack_wait_ns = config.ack_wait
        limit = config.max_ack_pending
        self._ack_limit = limit if limit > 0 and not self.ack_none else 0

    def matches(self, subject: str) -> bool:
        hit = self._match_cache.get(subject)
        if hit is None:
            hit = not self.filters or any(subject_matches(f, subject) for f in self.filters)
            self._match_cache[subject] = hit
        return hit

    def _ack_wait(self, deliveries: int) -> int:
        backoff = self._backoff
        if backoff:
            return backoff[min(deliveries, len(backoff)) - 1]
        return self._ack_wait_ns

    def reconfigure(self, config: ConsumerConfig) -> None:
        """An accepted update (see ``consumer_config.check_update``): new limits and filters."""
        self._configure(config)
        self.waiting.max_waiting = config.max_waiting
        self.paused_until_ns = _pause_ns(config)
        filters = config.filters
        if filters != self.filters:
            self.filters = filters
            self._match_cache.clear()
            self._cursor = self._scanned = 0
            self._counted = self.stream.state.last_seq
            self._npc = self.stream.count_matching_after(max(self.sseq, self._resume), filters)

    # ---- counts -------------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Count the stream's messages that arrived since the last call (and only those)."""
        last = self.stream.state.last_seq
        floor = max(self.sseq, self._resume)
        if last < self._counted and self._counted > floor:
            # the stream rolled back what it had accepted: count afresh
            self._npc = self.stream.count_matching_after(floor, self.filters)
            self._counted = max(last, floor)
        elif last > self._counted:
            self._npc += self.stream.count_matching_after(self._counted, self.filters)
            self._counted = last

    def num_pending(self) -> int:
        self._catch_up()
        return self._npc + len(self._skip)

    def num_redelivered(self) -> int:
        return len(self._redelivered)

    def has_acked(self, seq: int) -> bool:
        """Whether this consumer is done with ``seq`` (passed it and holds no pending ack for it);
        what interest and work-queue retention ask."""
        return seq <= self.sseq and seq not in self.pending and seq not in self._skip

    def forget(self, seq: int, subject: str) -> None:
        """The stream removed a message (limits, delete, retention): if it was counted as still
        to come, it no longer is. (Not counted yet: the catch-up will find it gone.)"""
        if max(self.sseq, self._resume) < seq <= self._counted and self.matches(subject):
            self._npc -= 1

    # ---- delivery -----------------------------------------------------------------------------

    def paused(self, now_ns: int) -> bool:
        return self.paused_until_ns > now_ns

    def at_ack_limit(self) -> bool:
        return 0 < self._ack_limit <= len(self.pending)

    def next_seq(self) -> int | None:
        """The stream sequence ``deliver`` would take next (a redelivery first), without taking it."""
        while self.redeliver:
            seq = self.redeliver[0]
            if seq in self.pending:
                return seq
            self.redeliver.popleft()
            self._queued.discard(seq)
        if 0 < self._ack_limit <= len(self.pending):
            return None
        if self._skip:
            return self._skip[0]
        return self._next_new()

    def _next_new(self) -> int | None:
        """The next message above ``sseq`` not delivered yet, through the cursor: a search only
        when the cursor was delivered or deleted, and then only from where it stood."""
        cur, sseq, stream = self._cursor, self.sseq, self.stream
        if cur > sseq:
            if stream.is_live(cur):
                return cur
            start = cur  # nothing matched between sseq and the dead cursor
        else:
            start = max(sseq, self._scanned) if not cur else sseq
        found = stream.next_matching(start, self.filters)
        self._cursor = found or 0
        self._scanned = max(start, stream.durable_last_seq)
        return found

    def has_work(self) -> bool:
        return self.next_seq() is not None

    def deliver(self, seq: int, now_ns: int) -> Delivered | None:
        """Deliver ``seq`` (as ``next_seq`` named it): a new consumer sequence, the message
        pending with its ack deadline. None if it is no longer due (acked meanwhile)."""
        if self.next_seq() != seq:
            return None
        return self._take(seq, now_ns)

    def deliver_run(
        self, limit: int, now_ns: int, lookup: Callable[[int], StoredMessage | None]
    ) -> list[tuple[StoredMessage, Delivered]]:
        """Up to ``limit`` deliveries in one call, each as ``next_seq`` then ``deliver`` would
        make it, while ``lookup`` (the tail cache) holds the next message: the caller reads the
        rest from storage one at a time."""
        out: list[tuple[StoredMessage, Delivered]] = []
        while len(out) < limit:
            if not self.redeliver and not self._skip:
                self._new_run(limit - len(out), now_ns, lookup, out)
                break
            seq = self.next_seq()
            if seq is None:
                break
            msg = lookup(seq)
            if msg is None:
                break
            out.append((msg, self._take(seq, now_ns)))
        return out

    def _new_run(
        self,
        limit: int,
        now_ns: int,
        lookup: Callable[[int], StoredMessage | None],
        out: list[tuple[StoredMessage, Delivered]],
    ) -> None:
        """``deliver_run`` of messages never delivered (no redelivery or skip list due): one
        search for the next sequences, each delivered as ``_take`` would."""
        if self._ack_limit:
            limit = min(limit, self._ack_limit - len(self.pending))
        first = self._next_new() if limit > 0 else None
        msg = lookup(first) if first is not None else None
        if first is None or msg is None:
            return  # (no search for more when the first is not held: the caller reads it)
        stream = self.stream
        seqs = [first]
        if limit > 1:
            seqs += stream.seqs_at_or_after(first + 1, self.filters, stream.durable_last_seq, limit - 1)
        self._catch_up()
        timed = self._timed
        deadline = now_ns + self._ack_wait(1) if timed else 0
        dseq, npc, ack_none = self.dseq, self._npc, self.ack_none
        floor_sseq, floor_cseq = self.ack_floor_sseq, self.ack_floor_cseq
        pending, order, heap = self.pending, self._order, self._deadlines
        new = tuple.__new__  # a named tuple without its Python-level constructor call
        sseq = 0
        for seq in seqs:
            if seq != first:
                msg = lookup(seq)
                if msg is None:
                    break
            dseq += 1
            npc -= 1
            sseq = seq
            if ack_none:
                floor_sseq, floor_cseq = seq, dseq
            else:
                pending[seq] = Pending(dseq, 1, deadline, now_ns)
                order.append(seq)
                if timed:
                    heapq.heappush(heap, (deadline, seq))
            out.append((msg, new(Delivered, (seq, dseq, 1, npc, seq, floor_sseq, floor_cseq))))
        if not sseq:
            return
        # the cursor stays on the first sequence not delivered, else on the last delivered
        self._cursor = seq
        self.sseq, self.dseq, self._npc, self.last_active_ns = sseq, dseq, npc, now_ns
        self.ack_floor_sseq, self.ack_floor_cseq = floor_sseq, floor_cseq

    def _take(self, seq: int, now_ns: int) -> Delivered:
        self.dseq += 1
        self.last_active_ns = now_ns
        p = self.pending.get(seq) if self.redeliver and self.redeliver[0] == seq else None
        if p is not None:
            self.redeliver.popleft()
            self._queued.discard(seq)
            p.sent_ns = now_ns
            p.deliveries += 1
            self._redelivered.add(seq)
            deliveries = p.deliveries
        else:
            if self._skip:
                self._skip.popleft()
                self.sseq = seq if self._skip else max(self._resume, seq)
            else:
                self._catch_up()
                self._npc -= 1
                self.sseq = seq
            deliveries = 1
            if self.ack_none:
                self.ack_floor_cseq, self.ack_floor_sseq = self.dseq, seq
            else:
                p = self.pending[seq] = Pending(self.dseq, 1, 0, now_ns)
                self._order.append(seq)
        if p is not None:
            self._arm(seq, p, now_ns + self._ack_wait(deliveries))
        self._catch_up()
        return Delivered(
            seq,
            self.dseq,
            deliveries,
            self._npc + len(self._skip),
            self.sseq,
            self.ack_floor_sseq,
            self.ack_floor_cseq,
        )

    def _arm(self, seq: int, p: Pending, deadline_ns: int) -> None:
        if self._timed:
            p.deadline_ns = deadline_ns
            heapq.heappush(self._deadlines, (deadline_ns, seq))

    def _queue_redelivery(self, seq: int) -> None:
        if seq not in self._queued:
            self._queued.add(seq)
            self.redeliver.append(seq)

    # ---- acks ---------------------------------------------------------------------------------

    def ack(self, seq: int, cseq: int, now_ns: int) -> Pending | None:
        """A positive ack (``+ACK``, ``+NXT``, and ``+TERM`` underneath): the pending record it
        settled, or None when nothing changed (a late or repeated ack)."""
        if self.ack_all:
            return self._ack_all(seq, cseq, now_ns)
        p = self.pending.pop(seq, None)
        if p is None:
            return None
        self._queued.discard(seq)
        self._redelivered.discard(seq)
        self.ack_floor_active_ns = now_ns
        self._floor_after(seq, p)
        return p

    def ack_run(self, seqs: list[int], now_ns: int, room: int) -> tuple[int, list[tuple[int, int, int]]]:
        """Plain acks of ``seqs`` (explicit policy; AckAll goes through :meth:`ack`), applied in
        one call exactly as ``ack`` one after the other would: how many were taken, and for each
        that settled a pending message (stream seq, floor stream seq, floor consumer seq) as
        they stood right after it. Taking stops once ``room`` acks have settled: the ack log
        takes no more rows, so the rest are not taken (and their messages are redelivered)."""
        assert not self.ack_all
        pending, queued, redelivered = self.pending, self._queued, self._redelivered
        settled: list[tuple[int, int, int]] = []
        taken = 0
        for seq in seqs:
            if len(settled) >= room:
                break
            taken += 1
            p = pending.pop(seq, None)
            if p is None:
                continue
            if queued:
                queued.discard(seq)
            if redelivered:
                redelivered.discard(seq)
            self._floor_after(seq, p)
            settled.append((seq, self.ack_floor_sseq, self.ack_floor_cseq))
        if settled:
            self.ack_floor_active_ns = now_ns
        return taken, settled

    def _floor_after(self, seq: int, p: Pending) -> None:
        """Move the ack floor after ``seq`` (its pending record ``p``) left the pending set."""
        if not self.pending:
            self.ack_floor_cseq, self.ack_floor_sseq = self.dseq, self.sseq
        elif p.cseq == self.ack_floor_cseq + 1:
            self.ack_floor_cseq, self.ack_floor_sseq = p.cseq, seq
            lowest = self._lowest_pending_above(seq)
            if lowest is not None and lowest < self.sseq + 1:
                self.ack_floor_cseq = self.pending[lowest].cseq - 1
                self.ack_floor_sseq = lowest - 1

    def _lowest_pending_above(self, seq: int) -> int | None:
        order, pending = self._order, self.pending
        while order and order[0] not in pending:
            order.popleft()
        for s in order:
            if s > seq and s in pending:
                return s
        return None

    def _ack_all(self, seq: int, cseq: int, now_ns: int) -> Pending | None:
        """Settles everything up to ``seq``; an ack above the last delivered message is ignored,
        as the server ignores it (it would move the floor past messages never delivered)."""
        if cseq <= self.ack_floor_cseq or seq <= self.ack_floor_sseq or seq > self.sseq:
            return None
        self.ack_floor_cseq, self.ack_floor_sseq = cseq, seq
        self.ack_floor_active_ns = now_ns
        settled = self.pending.get(seq, Pending(cseq, 1, 0, 0))
        order = self._order
        while order and order[0] <= seq:
            s = order.popleft()
            if self.pending.pop(s, None) is None:
                continue
            self._queued.discard(s)
            self._redelivered.discard(s)
        return settled

    def nak(self, seq: int, delay_ns: int, now_ns: int) -> bool:
        """``-NAK``: queue the redelivery now (behind those queued before, ahead of new messages;
        a backoff does not hold it back), or with a ``delay`` take it off the queue and redeliver
        after the delay, as the server's ``processNak`` does."""
        p = self.pending.get(seq)
        if p is None:
            return False
        if delay_ns > 0:
            if seq in self._queued:
                self._queued.discard(seq)
                self.redeliver.remove(seq)
            self._arm(seq, p, now_ns + delay_ns)
        else:
            self._queue_redelivery(seq)
        return True

    def reset(self, seq: int) -> None:
        """``CONSUMER.RESET``: start again at stream sequence ``seq`` (0: just above the ack floor);
        pending acks, redeliveries and the consumer sequence start from nothing."""
        start = (seq or self.ack_floor_sseq + 1) - 1
        self.dseq = 0
        self.sseq = self._resume = start
        self.ack_floor_cseq, self.ack_floor_sseq = 0, start
        self.pending.clear()
        self._order.clear()
        self.redeliver.clear()
        self._queued.clear()
        self._redelivered.clear()
        self._deadlines.clear()
        self._skip.clear()
        self._cursor = self._scanned = 0
        self._counted = self.stream.state.last_seq
        self._npc = self.stream.count_matching_after(start, self.filters)

    def passed(self, seq: int) -> None:
        """``seq`` turned out to be gone from storage: move past it without delivering."""
        if self.pending.pop(seq, None) is not None:
            self._queued.discard(seq)
            return
        if self._skip and self._skip[0] == seq:
            self._skip.popleft()
        elif seq > self.sseq:
            self._catch_up()
            self._npc -= 1
            self.sseq = seq

    def progress(self, seq: int, now_ns: int) -> bool:
        """``+WPI``: the ack wait starts again."""
        p = self.pending.get(seq)
        if p is None:
            return False
        self._arm(seq, p, now_ns + self._ack_wait(p.deliveries))
        return True

    def term(self, seq: int, cseq: int, now_ns: int) -> Pending | None:
        """``+TERM``: never redeliver; the server processes it as an ack underneath."""
        return self.ack(seq, cseq, now_ns)

    def expire(self, now_ns: int) -> list[tuple[int, int]]:
        """Queue for redelivery every pending message whose ack wait ran out, those of one call
        in stream order (the server's ``checkPending`` sorts what one pass found). Those that
        have been delivered ``max_deliver`` times leave pending instead (the floor stays); they
        are returned as (stream seq, deliveries) for the MAX_DELIVERIES advisory."""
        exhausted: list[tuple[int, int]] = []
        due: list[int] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now_ns:
            deadline, seq = heapq.heappop(heap)
            p = self.pending.get(seq)
            if p is None or p.deadline_ns != deadline or seq in self._queued:
                continue
            if 0 < self.max_deliver <= p.deliveries:
                del self.pending[seq]
                exhausted.append((seq, p.deliveries))
                continue
            due.append(seq)
        for seq in sorted(due):
            self._queue_redelivery(seq)
        return exhausted

    def last_ack_deadline_ns(self) -> int | None:
        """When the ack wait of the pending message acked last runs out (its nak delay, for a
        nak'd one), None with nothing pending: a pull consumer is not inactive before it."""
        return max((p.deadline_ns for p in self.pending.values()), default=None)

    def next_deadline_ns(self) -> int | None:
        """The earliest ack-wait (or nak delay) deadline :meth:`expire` would act on, None if none.
        Entries left behind by acks and re-arms are dropped from the top here (``expire`` would
        skip them), so a timer set to the answer does not wake for a message already acked."""
        heap, pending = self._deadlines, self.pending
        while heap:
            deadline, seq = heap[0]
            p = pending.get(seq)
            if p is not None and p.deadline_ns == deadline and seq not in self._queued:
                return deadline
            heapq.heappop(heap)
        return None

    # ---- restart ------------------------------------------------------------------------------

    def restore(self, state: ConsumerState) -> None:
        """Take up the state the ack log rebuilt (the consumer was built with its recorded start
        and remaining skip list). A pending message's ack wait runs from its delivery or last
        progress ack; a nak'd one is due when the nak said."""
        self.dseq, self.last_active_ns = state.delivered_cseq, state.delivered_ns
        if state.delivered_cseq:
            self.sseq = state.delivered_sseq
        self.ack_floor_cseq, self.ack_floor_sseq = state.floor_cseq, state.floor_sseq
        self.ack_floor_active_ns = state.floor_ns
        self._redelivered = set(state.redelivered)
        self.pending = {}
        for seq, p in sorted(state.pending.items()):
            pending = self.pending[seq] = Pending(p.cseq, p.deliveries, 0, p.since_ns)
            due = p.due_ns if p.due_ns is not None else p.since_ns + self._ack_wait(p.deliveries)
            self._arm(seq, pending, due)
        self._cursor = self._scanned = 0
        self._counted = self.stream.state.last_seq
        self._npc = self.stream.count_matching_after(max(self.sseq, self._resume), self.filters)

    def saved_state(self) -> ConsumerState:
        """The state :meth:`restore` takes back (what a stream archive keeps of the consumer): its
        positions, where it started, the pending messages with the time their ack wait began,
        and the redelivered ones."""
        return ConsumerState(
            created_ns=self.created_ns,
            config=None,
            start_after=self._resume,
            skip=list(self._skip),
            delivered_cseq=self.dseq,
            delivered_sseq=self.sseq,
            floor_cseq=self.ack_floor_cseq,
            floor_sseq=self.ack_floor_sseq,
            pending={
                seq: PendingState(p.cseq, p.deliveries, p.deadline_ns - self._ack_wait(p.deliveries))
                for seq, p in self.pending.items()
            },
            redelivered=set(self._redelivered),
        )

    # ---- info ---------------------------------------------------------------------------------

    def info(self, stream_name: str, now_ns: int, push_bound: bool = False) -> ConsumerInfo:
        """What CONSUMER.INFO shows; ``push_bound`` is the leaf's to know (who subscribes)."""
        paused = self.paused(now_ns)
        return ConsumerInfo(
            stream_name=stream_name,
            name=self.name,
            created=rfc3339(self.created_ns),
            config=self.config,
            delivered=SequenceInfo(self.dseq, self.sseq, _time(self.last_active_ns)),
            ack_floor=SequenceInfo(self.ack_floor_cseq, self.ack_floor_sseq, _time(self.ack_floor_active_ns)),
            num_ack_pending=len(self.pending),
            num_redelivered=self.num_redelivered(),
            num_waiting=self.waiting.live(now_ns),
            num_pending=self.num_pending(),
            push_bound=push_bound,
            paused=paused,
            pause_remaining=self.paused_until_ns - now_ns if paused else 0,
            ts=rfc3339(now_ns),
            priority_groups=self._group_states(),
        )

    def _group_states(self) -> tuple[PriorityGroupState, ...]:
        """The server shows its first priority group only, with the consumer's one pin (whichever
        group it was given in), on every policy."""
        groups, pin = self.config.priority_groups, self.pin
        if not groups:
            return ()
        if pin is None:
            return (PriorityGroupState(groups[0], "", rfc3339(0)),)
        return (PriorityGroupState(groups[0], pin.id, rfc3339(pin.since_ns)),)


def _time(ns: int) -> str:
    """A moment as the info shows it, or nothing (left out) before there was one."""
    return rfc3339(ns) if ns else ""


def _pause_ns(config: ConsumerConfig) -> int:
    return parse_time_ns(config.pause_until) if config.pause_until else 0
