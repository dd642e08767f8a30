"""A stream's state machine: sequences, counts, limits and removals, with no I/O.

The gateway is the real-time authority: this object answers every question about the stream at
once. It moves by ``accept`` (a publish given a sequence, limits applied at once),
``committed``/``rollback`` (what the writer made durable, or failed to), and the removals: ``remove``
(one sequence), ``purge`` and ``expire`` (MaxAge). A removed sequence leaves a hole; the first
sequence moves over holes. Every removal is also queued as a sequence range for the durable removal
log (``take_removals``), so a restart rebuilds the same view (docs/storage.md, ``removals``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.api import errors
from gateway.api.configs import StreamConfig
from gateway.api.timefmt import rfc3339
from gateway.engine.dedup import DedupWindow
from gateway.engine.msg_ttl import TTLSchedule
from gateway.engine.stream_index import SeqIndex, SubjectSeqs, TailCache
from gateway.runtime.signals import Signal
from storage_delta.commit.writer import StoredMessage
from storage_delta.format.nats import subject_matches
from storage_delta.format.schema import DEFAULT_BLOCK_SIZE, RECORD_OVERHEAD, stored_size
from storage_delta.format.subject_transform import SubjectTransform
from storage_delta.read.reader import StoredIndex

__all__ = ["Stream", "StreamState", "TailCache"]

#: A publish as ``accept_run`` takes it: subject, header block (or None), payload.
Publish = tuple[str, bytes | None, bytes]

MAX_MSGS = errors.STREAM_STORE_FAILED.format(err="maximum messages exceeded")
MAX_BYTES = errors.STREAM_STORE_FAILED.format(err="maximum bytes exceeded")
#: Removal-log ranges longer than this are replayed with array operations.
BULK_RESTORE = 64

MAX_MSGS_PER_SUBJECT = errors.STREAM_STORE_FAILED.format(err="maximum messages per subject exceeded")


@dataclass(frozen=True, slots=True)
class Limits:
    """The config's limits as plain numbers (0: none), read once per config rather than per publish."""

    max_msgs: int
    max_bytes: int
    max_age: int
    per_subject: int
    discard_new: bool
    discard_new_per_subject: bool
    sealed: bool

    @classmethod
    def of(cls, config: StreamConfig) -> Limits:
        return cls(
            max(0, config.max_msgs),
            max(0, config.max_bytes),
            max(0, config.max_age),
            max(0, config.max_msgs_per_subject),
            config.discard == "new",
            config.discard_new_per_subject,
            config.sealed,
        )


@dataclass(slots=True)
class StreamState:
    """Live counts. ``first_seq`` is the first live sequence, ``last_seq + 1`` when the stream is
    empty after having messages, 0 before its first message (as JetStream shows them)."""

    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    first_ts: int = 0
    last_seq: int = 0
    last_ts: int = 0


def _literal(subject: str) -> bool:
    return "*" not in subject.split(".") and not subject.endswith(">")


class Stream:
    """One stream: its config and the live state derived from what it stored."""

    def __init__(self, config: StreamConfig, created_ns: int, tail_cache_bytes: int) -> None:
        self.config = config
        self.created_ns = created_ns
        self.block_size = DEFAULT_BLOCK_SIZE
        self.state = StreamState()
        self.durable_last_seq = 0
        #: Sequences of damaged data files (what JetStream's stream info calls ``lost``) and the
        #: bytes they had in the restored index, where it knew them.
        self.lost: list[int] = []
        self.lost_bytes = 0
        self.tail = TailCache(tail_cache_bytes)
        self.dedup = DedupWindow()
        self.ttl = TTLSchedule()
        #: Subjects whose last message MaxAge or a TTL removed, waiting for a delete marker (ADR-43);
        #: the publish path stores the markers.
        self.markers_due: list[str] = []
        first_seq = config.first_seq
        if first_seq > 1:  # the first publish gets ``first_seq``
            self.state.first_seq = first_seq
            self.state.last_seq = self.durable_last_seq = first_seq - 1
        # Subject names are interned to small ids: the per-sequence index stores four bytes of
        # subject, and per-subject sequence lists answer last-by-subject and per-subject limits.
        self._index = SeqIndex()
        self._subject_names: list[str] = [""]
        self._subject_ids: dict[str, int] = {}
        self._subject_counts: dict[int, int] = {}
        self._free_sids: list[int] = []  # ids of subjects with no message left, for reuse
        self._by_subject: dict[int, SubjectSeqs] = {}
        self._removed: list[list[int]] = []  # ranges not yet handed to the removal log
        #: Told of each message removed (seq, subject), so consumers keep num_pending exact.
        self.msg_removed: Signal[[int, str]] = Signal()
        #: Told when removals start waiting for the removal log (the queue was empty), so the
        #: task that records them sleeps while there is nothing to record.
        self.removal_queued: Signal[[]] = Signal()
        #: Told whenever ``durable_last_seq`` advances, the stream rolls back to it, or
        #: the stream ends: an answer waiting for a commit is woken by it instead of polling.
        self.durable_moved: Signal[[]] = Signal()
        self.ended = False  # deleted: nothing it waits for will come

    @property
    def subjects(self) -> tuple[str, ...]:
        return self.config.subjects

    @property
    def last_seq(self) -> int:
        return self.state.last_seq

    def captures(self, subject: str) -> bool:
        return any(subject_matches(f, subject) for f in self.subjects)

    @property
    def config(self) -> StreamConfig:
        return self._config

    @config.setter
    def config(self, config: StreamConfig) -> None:
        self._config = config
        self.name = config.name  # read per delivered message and per ack
        self.limits = Limits.of(config)
        # Read for every publish, so derived once per config.
        self.name_bytes = self.name.encode()
        self.no_ack = config.no_ack
        # Configs are validated before they get here, so these parse.
        transform = config.subject_transform or {}
        #: Applied to a publish's subject before anything else looks at it (``subject_transform``).
        self.input_transform = SubjectTransform.parse(transform.get("src", ""), transform.get("dest", ""))
        republish = config.republish or {}
        #: Where a stored message is published again once committed (``republish``), if anywhere.
        self.republish = SubjectTransform.parse(republish.get("src", ""), republish.get("dest", ""))
        self.republish_headers_only = bool(republish.get("headers_only"))
        #: what a message counts for beyond its bytes, as the stream's storage counts it (a
        #: memory stream is stored in the lake like any other, but counts as the memory store)
        self.record_overhead = RECORD_OVERHEAD[config.storage]

    # ---- adding --------------------------------------------------------------------------------

    def _subject_id(self, subject: str) -> int:
        sid = self._subject_ids.get(subject)
        if sid is None:
            if self._free_sids:
                sid = self._free_sids.pop()
                self._subject_names[sid] = subject
            else:
                sid = len(self._subject_names)
                self._subject_names.append(subject)
            self._subject_ids[subject] = sid
        return sid

    def _add(self, seq: int, subject: str, size: int, ts: int) -> int:
        sid = self._subject_ids.get(subject)
        if sid is None:
            sid = self._subject_id(subject)
        self._index.append(seq, sid, size, ts)
        counts = self._subject_counts
        counts[sid] = counts.get(sid, 0) + 1
        seqs = self._by_subject.get(sid)
        if seqs is None:
            seqs = self._by_subject[sid] = SubjectSeqs()
        seqs.add(seq)
        st = self.state
        if st.messages == 0:
            st.first_seq, st.first_ts = seq, ts
        st.messages += 1
        st.bytes += size
        st.last_seq, st.last_ts = seq, ts
        return sid

    def _check_discard_new(self, subject: str, size: int, rollup: bool) -> None:
        """Refuse a message a ``discard: new`` stream has no room for, as JetStream's store does:
        a message that will replace its subject's oldest (per-subject limit) is not refused for
        MaxMsgs, and for MaxBytes only when it is larger than that oldest message. A rollup is
        never refused for its subject's limit, as it purges the subject once stored."""
        lim = self.limits
        if not lim.discard_new:
            return
        per_subject = lim.per_subject
        sid = self._subject_ids.get(subject, 0)
        replaces = 0
        if per_subject and self._subject_counts.get(sid, 0) >= per_subject:
            if lim.discard_new_per_subject and not rollup:
                raise MAX_MSGS_PER_SUBJECT
            replaces = self._oldest_of(sid)
        st = self.state
        max_msgs, max_bytes = lim.max_msgs, lim.max_bytes
        if max_msgs and st.messages >= max_msgs and not replaces:
            raise MAX_MSGS
        too_big = max_bytes and st.bytes + size > max_bytes
        if too_big and (not replaces or self._size_of(replaces) <= size):
            raise MAX_BYTES

    def room_for(self, items: Sequence[Publish]) -> tuple[int, errors.ApiError] | None:
        """Where ``discard: new`` refuses an atomic batch: the index of the first of ``items`` that
        would not fit, those before it counted as stored and none replacing an older message, and
        the error, as the server checks each message of a batch in turn (a rollup is not held to
        its subject's limit, but counts for the messages after it), so no ``accept`` of them can
        then be refused halfway."""
        lim = self.limits
        if not lim.discard_new:
            return None
        st = self.state
        messages, size = st.messages, st.bytes
        per_subject = lim.per_subject if lim.discard_new_per_subject else 0
        added: dict[str, int] = {}
        for i, (subject, hdrs, data) in enumerate(items):
            messages += 1
            size += stored_size(subject, hdrs, data, self.record_overhead)
            if lim.max_msgs and messages > lim.max_msgs:
                return i, MAX_MSGS
            if lim.max_bytes and size > lim.max_bytes:
                return i, MAX_BYTES
            if per_subject:
                n = added[subject] = added.get(subject, 0) + 1
                stored = self._subject_counts.get(self._subject_ids.get(subject, 0), 0)
                if stored + n > per_subject and not (hdrs and b"\r\nNats-Rollup:" in hdrs):
                    return i, MAX_MSGS_PER_SUBJECT
        return None

    @property
    def takes_runs(self) -> bool:
        """No limit can refuse a publish (not sealed, no ``discard: new``) and none is republished
        (each needs its subject's previous sequence): ``accept_run`` may take several at once."""
        return not (self.limits.sealed or self.limits.discard_new or self.republish)

    def accept_run(self, items: Sequence[Publish], now_ns: int) -> list[StoredMessage]:
        """``accept`` for several publishes (subject, headers, payload) in one call, with the same
        outcome as one call each; only while ``takes_runs``."""
        assert self.takes_runs
        return self._append(items, now_ns)

    def accept(
        self, subject: str, hdrs: bytes | None, data: bytes, now_ns: int, rollup: bool = False
    ) -> StoredMessage:
        """Give a publish the next sequence and apply the limits at once; durable only once
        committed. Raises :class:`~gateway.errors.ApiError` when ``discard: new`` refuses it
        (``rollup``: it carries ``Nats-Rollup``)."""
        lim = self.limits
        if lim.sealed:
            raise errors.STREAM_SEALED
        if lim.discard_new:
            size = stored_size(subject, hdrs, data, self.record_overhead)
            self._check_discard_new(subject, size, rollup)
        return self._append(((subject, hdrs, data),), now_ns)[0]

    def accept_mirrored(
        self, seq: int, ts: int, subject: str, hdrs: bytes | None, data: bytes
    ) -> StoredMessage:
        """A mirror's copy of its origin's message: the origin's sequence, the sequences the origin
        no longer has skipped (holes, as deleted messages); limits apply as to a publish.

        The origin's time, but never before the mirror was created (nor before its last message):
        a stored time tells a stream's rows from those of an earlier stream of the same name
        (recovery, cold reads, Spark's logical view and the jobs keep rows stored at or after the
        stream's creation), so history copied at creation carries the creation time."""
        st = self.state
        assert seq > st.last_seq, (seq, st.last_seq)
        ts = max(ts, self.created_ns, st.last_ts + 1)
        st.last_seq = seq - 1
        msg = StoredMessage(self.name, self.block_size, seq, ts, subject, hdrs, data)
        sid = self._add(seq, subject, stored_size(subject, hdrs, data, self.record_overhead), ts)
        self.tail.put(msg)
        if self.limits.per_subject:
            self._enforce_subject_limit(sid)
        if self.limits.max_msgs or self.limits.max_bytes:
            self._enforce_size_limits()
        return msg

    def _append(self, items: Sequence[Publish], now_ns: int) -> list[StoredMessage]:
        lim = self.limits
        per_subject, sized = lim.per_subject, lim.max_msgs or lim.max_bytes
        if not (per_subject or sized):
            return self._append_unlimited(items, now_ns)
        st, name, block_size, put = self.state, self.name, self.block_size, self.tail.put
        out = []
        for subject, hdrs, data in items:
            seq = st.last_seq + 1
            ts = now_ns if now_ns > st.last_ts else st.last_ts + 1
            msg = StoredMessage(name, block_size, seq, ts, subject, hdrs, data)
            sid = self._add(seq, subject, stored_size(subject, hdrs, data, self.record_overhead), ts)
            put(msg)
            if per_subject:
                self._enforce_subject_limit(sid)
            if sized:
                self._enforce_size_limits()
            out.append(msg)
        return out

    def _append_unlimited(self, items: Sequence[Publish], now_ns: int) -> list[StoredMessage]:
        """``_add`` for a whole run at once, where no limit removes anything in between: the
        per-sequence index, the counts and the tail cache take the run in one step each."""
        st, name, block_size = self.state, self.name, self.block_size
        ids, counts, by_subject = self._subject_ids, self._subject_counts, self._by_subject
        first = seq = st.last_seq + 1
        ts = st.last_ts
        out: list[StoredMessage] = []
        sids, sizes, times = array("I"), array("I"), array("q")
        for subject, hdrs, data in items:
            ts = now_ns if now_ns > ts else ts + 1
            sid = ids.get(subject)
            if sid is None:
                sid = self._subject_id(subject)
            out.append(StoredMessage(name, block_size, seq, ts, subject, hdrs, data))
            sids.append(sid)
            sizes.append(stored_size(subject, hdrs, data, self.record_overhead))
            times.append(ts)
            counts[sid] = counts.get(sid, 0) + 1
            seqs = by_subject.get(sid)
            if seqs is None:
                seqs = by_subject[sid] = SubjectSeqs()
            seqs.add(seq)
            seq += 1
        if not out:
            return out
        self._index.extend(first, sids, sizes, times)
        if st.messages == 0:
            st.first_seq, st.first_ts = first, out[0].ts
        st.messages += len(out)
        st.bytes += sum(sizes)
        st.last_seq, st.last_ts = seq - 1, ts
        self.tail.put_many(out)
        return out

    def restore(self, seq: int, ts: int, subject: str, size: int) -> None:
        """Account for a message found in the table at start-up (limits are applied afterwards,
        by ``enforce_limits``, once the removal log has been replayed)."""
        self._add(seq, subject, size, ts)
        self.durable_last_seq = seq

    def restore_stored(self, stored: StoredIndex) -> None:
        """Account for every message found in the table at start-up at once, with array operations
        rather than a call per message (a million messages take well under a second). Only for a
        stream that holds nothing yet; limits apply afterwards, as after :meth:`restore`."""
        n = len(stored.seq)
        if not n:
            return
        if self.state.messages or len(self._index.sid):
            raise ValueError("restore_stored needs a stream with nothing in it")
        sid = np.array([self._subject_id(name) for name in stored.subjects], np.uint32)[stored.subject_codes]
        self._index = SeqIndex.of(stored.seq, sid, stored.size, stored.ts)
        counts = np.bincount(sid)
        # A stable sort by subject keeps each subject's sequences ascending; 16-bit keys sort in
        # linear time (radix), which is what almost every stream has.
        keys = sid.astype(np.uint16) if len(self._subject_names) <= 1 << 16 else sid
        by_subject = stored.seq[np.argsort(keys, kind="stable")]
        ends = np.cumsum(counts)
        for s in np.flatnonzero(counts).tolist():
            self._subject_counts[s] = int(counts[s])
            self._by_subject[s] = SubjectSeqs(by_subject[ends[s] - counts[s] : ends[s]])
        st = self.state
        st.messages, st.bytes = n, int(stored.size.sum())
        st.first_seq, st.first_ts = int(stored.seq[0]), int(stored.ts[0])
        st.last_seq, st.last_ts = int(stored.seq[-1]), int(stored.ts[-1])
        self.durable_last_seq = st.last_seq

    def stored_snapshot(self) -> tuple[int, StoredIndex]:
        """The live committed messages as arrays (what :meth:`restore_stored` takes back) and the
        sequence they go up to: every sequence up to it that they leave out is removed. Copies, so
        the stream may change while the copy is written out."""
        idx, through = self._index, self.durable_last_seq
        n = max(0, min(idx.end, through + 1) - idx.base)
        sid = np.frombuffer(idx.sid[:n], np.uint32)
        live = np.flatnonzero(sid)
        counts = np.bincount(sid[live], minlength=len(self._subject_names))
        used = np.flatnonzero(counts)
        code_of = np.zeros(len(counts), np.int64)
        code_of[used] = np.arange(len(used))
        stored = StoredIndex(
            live + idx.base,
            np.frombuffer(idx.ts[:n], np.int64)[live],
            np.frombuffer(idx.size[:n], np.uint32)[live].astype(np.int64),
            code_of[sid[live]],
            [self._subject_names[s] for s in used.tolist()],
            [],
        )
        return through, stored

    def restore_last_seq(self, last_seq: int) -> None:
        """The removal log knows of sequences above the highest stored one (they were removed and
        may be gone from storage): the stream continues after them."""
        st = self.state
        if last_seq > st.last_seq:
            st.last_seq = last_seq
            self.durable_last_seq = last_seq
            if st.messages == 0:
                st.first_seq = last_seq + 1

    def skip_to(self, last_seq: int) -> None:
        """A restored stream continues after ``last_seq``, as its archive's did: the sequences
        above its last restored message were removed there, and are recorded as removed here (the
        removal log keeps the last sequence across a restart). Only on a stream whose every
        message is durable."""
        st = self.state
        if last_seq <= st.last_seq:
            return
        self._record(st.last_seq + 1, last_seq)
        self.restore_last_seq(last_seq)

    def restore_lost(self, first: int, last: int) -> None:
        """A damaged data file held ``first..last``: they are removed (never served), reported as
        ``lost`` in the stream's info, as JetStream reports the records of a corrupt block, and the
        stream goes on after them (nothing is numbered again)."""
        before = self.state.bytes
        self.restore_removed(first, last)
        self.restore_last_seq(last)
        self.lost.extend(range(first, last + 1))
        self.lost_bytes += before - self.state.bytes

    def committed(self, seq: int) -> None:
        self.durable_last_seq = max(self.durable_last_seq, seq)
        self.durable_moved.emit()

    def end(self) -> None:
        """The stream was deleted: whoever waits on its durable sequence is told."""
        self.ended = True
        self.durable_moved.emit()

    # ---- limits ----------------------------------------------------------------------------------

    def _enforce_subject_limit(self, sid: int) -> None:
        per_subject = self.limits.per_subject
        while per_subject and self._subject_counts.get(sid, 0) > per_subject:
            self.remove(self._oldest_of(sid))

    def _enforce_size_limits(self) -> None:
        lim = self.limits
        if lim.discard_new:
            return
        st = self.state
        max_msgs, max_bytes = lim.max_msgs, lim.max_bytes
        while max_msgs and st.messages > max_msgs:
            self.remove(st.first_seq)
        while max_bytes and st.bytes > max_bytes:
            self.remove(st.first_seq)

    def expire(self, now_ns: int) -> int:
        """Remove what per-message TTLs and MaxAge have expired; the number removed. Messages with
        ``Nats-TTL: never`` outlive MaxAge; every other TTL is bounded by it."""
        n = 0
        for seq, ts in self.ttl.due(now_ns):
            if self.is_live(seq) and self._index.ts[seq - self._index.base] == ts:
                n += self._expire_one(seq)
        max_age = self.limits.max_age
        if not max_age:
            return n
        cutoff = now_ns - max_age
        st = self.state
        if not self.ttl.never:
            while st.messages and st.first_ts <= cutoff:
                n += self._expire_one(st.first_seq)
            return n
        seq = st.first_seq
        while st.messages and seq < self._index.end:
            idx = self._index
            i = seq - idx.base
            if idx.sid[i]:
                if idx.ts[i] > cutoff:
                    break
                if seq not in self.ttl.never:
                    n += self._expire_one(seq)
            seq += 1
        return n

    def _expire_one(self, seq: int) -> int:
        """Remove a message whose time ran out; a subject left empty gets a delete marker when
        ``subject_delete_marker_ttl`` asks for them (but a marker's own expiry places none)."""
        subject = self.subject_of(seq)
        self.remove(seq)
        if seq in self.ttl.markers:
            self.ttl.markers.discard(seq)
        elif subject and self.config.subject_delete_marker_ttl and not self.last_seq_for(subject):
            self.markers_due.append(subject)
        return 1

    def next_expiry_ns(self) -> int | None:
        """When :meth:`expire` next has something to do (a TTL runs out, or the oldest message
        MaxAge applies to does), None when nothing will expire. Never later than the truth: a TTL
        of a message gone meanwhile may make it early. Messages ``Nats-TTL: never`` exempts are
        stepped over from the first, as ``expire`` steps over them."""
        when = self.ttl.next_ns()
        max_age = self.limits.max_age
        st = self.state
        if not max_age or not st.messages:
            return when
        oldest = st.first_ts
        never = self.ttl.never
        if never:
            idx, seq = self._index, st.first_seq
            while seq < idx.end and (not idx.sid[seq - idx.base] or seq in never):
                seq += 1
            if seq >= idx.end:
                return when
            oldest = idx.ts[seq - idx.base]
        return oldest + max_age if when is None else min(when, oldest + max_age)

    def enforce_limits(self, now_ns: int) -> None:
        """Apply every limit to what is stored (after recovery, or a config update that lowered one)."""
        if self.limits.per_subject:
            for sid in [s for s, c in self._subject_counts.items() if c]:
                self._enforce_subject_limit(sid)
        self._enforce_size_limits()
        self.expire(now_ns)

    # ---- removal -------------------------------------------------------------------------------

    def _live_seqs(self, sid: int) -> SubjectSeqs | None:
        """The subject's sequence list with dead ends trimmed, None when it has no message."""
        seqs = self._by_subject.get(sid)
        if seqs is not None:
            seqs.trim(self._index, sid)
        return seqs

    def _oldest_of(self, sid: int) -> int:
        seqs = self._live_seqs(sid)
        return seqs.oldest() if seqs else 0

    def _size_of(self, seq: int) -> int:
        return self._index.size[seq - self._index.base]

    def is_live(self, seq: int) -> bool:
        return self._index.subject_id(seq) != 0

    def subject_of(self, seq: int) -> str | None:
        sid = self._index.subject_id(seq)
        return self._subject_names[sid] if sid else None

    def _record(self, first: int, last: int) -> None:
        removed = self._removed
        if removed and removed[-1][1] + 1 == first:
            removed[-1][1] = last
            return
        if not removed:
            self.removal_queued.emit()
        removed.append([first, last])

    @property
    def removals_queued(self) -> bool:
        """Whether removals wait for the removal log (``take_removals`` leaves those above the
        durable sequence)."""
        return bool(self._removed)

    def _drop(self, seq: int) -> int:
        """Make a live sequence a hole and take it out of the counts; its subject id."""
        idx = self._index
        i = seq - idx.base
        sid = idx.sid[i]
        idx.sid[i] = 0
        subject = self._subject_names[sid]  # before un-counting may give the id back
        self._uncount(sid, idx.size[i])
        self.tail.drop(seq)
        self.msg_removed.emit(seq, subject)
        return sid

    def _uncount(self, sid: int, size: int) -> None:
        """Take one message of subject ``sid`` out of the counts."""
        st = self.state
        st.messages -= 1
        st.bytes -= size
        left = self._subject_counts[sid] - 1
        if left:
            self._subject_counts[sid] = left
        else:
            self._forget_subject(sid)

    def _forget_subject(self, sid: int) -> None:
        """A subject without messages gives its id back: no live sequence refers to it any more
        (holes are id 0), so streams with ever-new subjects (ids, keys) keep memory bounded."""
        del self._subject_counts[sid]
        del self._by_subject[sid]
        del self._subject_ids[self._subject_names[sid]]
        self._subject_names[sid] = ""
        self._free_sids.append(sid)

    def _advance_first(self) -> None:
        st, idx = self.state, self._index
        if st.messages == 0:
            st.first_seq, st.first_ts = st.last_seq + 1, 0
            self._index = SeqIndex()
            return
        seq = st.first_seq
        while not idx.subject_id(seq):
            seq += 1
        st.first_seq, st.first_ts = seq, idx.ts[seq - idx.base]
        idx.compact(seq)

    def remove(self, seq: int) -> bool:
        """Remove one live message (delete, TTL, limits, acked work-queue message); False when the
        sequence is not live. The first sequence moves when it was the first."""
        if not self.is_live(seq):
            return False
        self._drop(seq)
        self._record(seq, seq)
        if seq == self.state.first_seq:
            self._advance_first()
        return True

    def _matching_sids(self, subject: str) -> list[int]:
        if _literal(subject):
            sid = self._subject_ids.get(subject, 0)
            return [sid] if self._subject_counts.get(sid) else []
        return [sid for sid in self._subject_counts if subject_matches(subject, self._subject_names[sid])]

    def purge(self, subject: str | None = None, seq: int | None = None, keep: int | None = None) -> int:
        """JetStream's purge: everything, or the messages matching ``subject``; with ``seq`` only
        those below it, with ``keep`` all but the newest ``keep``. The number removed."""
        st = self.state
        if not subject:
            if keep:
                if st.messages <= keep:
                    return 0
                return self._purge_prefix(self._nth_live_seq(st.messages - keep) + 1)
            return self._purge_prefix(seq if seq else st.last_seq + 1)
        victims: list[int] = []
        limit = (seq - 1) if seq else st.last_seq
        for sid in self._matching_sids(subject):
            seqs = self._live_seqs(sid)
            if seqs is not None:
                victims.extend(seqs.live_upto(limit, self._index, sid))
        victims.sort()
        if keep:
            victims = victims[: max(0, len(victims) - keep)]
        for victim in victims:
            self.remove(victim)
        return len(victims)

    def _nth_live_seq(self, n: int) -> int:
        """The sequence of the ``n``-th live message (1-based), scanning from the first."""
        idx, seq, seen = self._index, self.state.first_seq, 0
        while True:
            if idx.subject_id(seq):
                seen += 1
                if seen == n:
                    return seq
            seq += 1

    def _purge_prefix(self, below: int) -> int:
        """Remove every message below ``below``; past the last sequence the stream continues
        from ``below`` (JetStream's compact). The number removed."""
        st, idx = self.state, self._index
        start = st.first_seq or 1
        if below > start:
            self._record(start, below - 1)
        if below > st.last_seq:  # everything goes: no need to un-count each message
            n = st.messages
            if self.msg_removed:
                names = self._subject_names
                for s in range(max(start, idx.base), idx.end):
                    if idx.subject_id(s):
                        self.msg_removed.emit(s, names[idx.subject_id(s)])
            st.last_seq = max(st.last_seq, below - 1)
            self.durable_last_seq = max(self.durable_last_seq, st.last_seq)
            self.durable_moved.emit()
            st.messages = st.bytes = 0
            for sid in list(self._subject_counts):
                self._forget_subject(sid)
            self.tail.clear()
            self._advance_first()
            return n
        n = 0
        for s in range(max(start, idx.base), min(below, idx.end)):
            if idx.subject_id(s):
                self._drop(s)
                n += 1
        self._advance_first()
        return n

    def take_removals(self) -> list[tuple[int, int]]:
        """Removed ranges not yet in the durable removal log, oldest first, as far as they cover
        committed sequences only (an uncommitted one may still be rolled back and reused)."""
        done: list[tuple[int, int]] = []
        keep: list[list[int]] = []
        for first, last in self._removed:
            if last <= self.durable_last_seq:
                done.append((first, last))
            elif first <= self.durable_last_seq:
                done.append((first, self.durable_last_seq))
                keep.append([self.durable_last_seq + 1, last])
            else:
                keep.append([first, last])
        self._removed = keep
        return done

    # ---- questions ------------------------------------------------------------------------------

    def last_seq_for(self, subject: str) -> int:
        """The newest live sequence stored under this literal subject, 0 when there is none."""
        seqs = self._live_seqs(self._subject_ids.get(subject, 0))
        return seqs.newest() if seqs else 0

    def last_seq_matching(self, subject: str) -> int:
        """The newest live sequence whose subject ``subject`` (wildcards allowed) matches, 0 if none."""
        return max(
            (self.last_seq_for(self._subject_names[sid]) for sid in self._matching_sids(subject)), default=0
        )

    def last_matching(self, filters: Sequence[str]) -> int | None:
        """The newest live sequence a filter matches, any subject without filters
        (``deliver_policy: last``); None when there is none."""
        if not filters:
            seq, idx = self.state.last_seq, self._index
            while seq >= self.state.first_seq and not idx.subject_id(seq):
                seq -= 1
            return seq if self.state.messages else None
        return max(self.last_per_subject(filters), default=None)

    def last_per_subject(self, filters: Sequence[str], upto: int | None = None) -> list[int]:
        """The newest live sequence at or below ``upto`` (default: all) of each subject the filters
        match (every subject without filters), ascending (``last_per_subject``, KV watch,
        DIRECT.GET ``multi_last``)."""
        sids = (
            set(self._subject_counts) if not filters else {s for f in filters for s in self._matching_sids(f)}
        )
        found = []
        for sid in sids:
            seqs = self._live_seqs(sid)
            if seqs is not None:
                seq = seqs.newest() if upto is None else seqs.last_at_or_below(upto, self._index, sid)
                if seq:
                    found.append(seq)
        return sorted(found)

    def seq_at_time(self, ts_ns: int) -> int:
        """The first live sequence stored at or after ``ts_ns`` (the one after the last when every
        message is older), as the server's store answers a ``start_time`` or ``up_to_time``."""
        idx = self._index
        n = len(idx.sid)
        live = np.frombuffer(idx.sid, np.uint32)[:n] != 0
        hits = np.flatnonzero(live & (np.frombuffer(idx.ts, np.int64)[:n] >= ts_ns))
        return int(hits[0]) + idx.base if len(hits) else self.state.last_seq + 1

    def first_seq_at_or_after(self, seq: int, filters: Sequence[str], limit: int | None = None) -> int | None:
        """The first live sequence at or above ``seq`` (and at or below ``limit``, by default the
        last accepted) whose subject a filter matches, any subject when there are no filters."""
        found = self.seqs_at_or_after(seq, filters, limit, 1)
        return found[0] if found else None

    def seqs_at_or_after(self, seq: int, filters: Sequence[str], limit: int | None, count: int) -> list[int]:
        """Up to ``count`` of the live sequences ``first_seq_at_or_after`` would name one after
        the other, ascending, in one search."""
        idx = self._index
        end = min(idx.end, (limit if limit is not None else self.state.last_seq) + 1)
        start = max(seq, self.state.first_seq, idx.base)
        if len(filters) == 1 and _literal(filters[0]):
            return self._seqs_of_subject(filters[0], start, end, count)
        if not filters:
            return self._seqs_of_any(start, end, count)
        return self._seqs_matching(filters, start, end, count)

    def _seqs_of_subject(self, subject: str, start: int, end: int, count: int) -> list[int]:
        """One literal subject: its own sequence list, not a walk over the others' messages."""
        idx = self._index
        out: list[int] = []
        sid = self._subject_ids.get(subject, 0)
        seqs = self._by_subject.get(sid)
        while seqs is not None and len(out) < count:
            found = seqs.first_at_or_after(start, idx, sid)
            if not found or found >= end:
                break
            out.append(found)
            start = found + 1
        return out

    def _seqs_of_any(self, start: int, end: int, count: int) -> list[int]:
        sids, base = self._index.sid, self._index.base
        out: list[int] = []
        for s in range(start, end):
            if sids[s - base]:
                out.append(s)
                if len(out) >= count:
                    break
        return out

    def _seqs_matching(self, filters: Sequence[str], start: int, end: int, count: int) -> list[int]:
        sids, base = self._index.sid, self._index.base
        out: list[int] = []
        names = self._subject_names
        hits: dict[int, bool] = {}  # a subject is matched once per search, not once per message
        for s in range(start, end):
            sid = sids[s - base]
            if sid:
                hit = hits.get(sid)
                if hit is None:
                    hit = hits[sid] = any(subject_matches(f, names[sid]) for f in filters)
                if hit:
                    out.append(s)
                    if len(out) >= count:
                        break
        return out

    def next_matching(self, after: int, filters: Sequence[str]) -> int | None:
        """The first durable live sequence above ``after`` whose subject a filter matches (any
        subject when there are no filters); consumers never see what is not committed yet."""
        return self.first_seq_at_or_after(after + 1, filters, self.durable_last_seq)

    def count_matching_after(self, after: int, filters: Sequence[str]) -> int:
        """Live messages above ``after`` a consumer with these filters would still get (num_pending)."""
        st, idx = self.state, self._index
        if not filters and after < st.first_seq:
            return st.messages
        start = max(after + 1, st.first_seq, idx.base)
        if start >= idx.end:
            return 0
        sids = idx.sid
        if not filters:
            return sum(1 for s in range(start, idx.end) if sids[s - idx.base])
        matches = {sid for f in filters for sid in self._matching_sids(f)}
        return sum(1 for s in range(start, idx.end) if sids[s - idx.base] in matches)

    @property
    def num_subjects(self) -> int:
        return len(self._subject_counts)

    def subject_counts(self, subject: str) -> dict[str, int]:
        """Live message count per subject that ``subject`` (wildcards allowed) matches."""
        return {self._subject_names[sid]: self._subject_counts[sid] for sid in self._matching_sids(subject)}

    def deleted(self) -> list[int]:
        """The holes from the first to the last sequence, ascending. Like JetStream's store, a
        fresh stream (first and last sequence 0) reports sequence 0 as deleted."""
        st, idx = self.state, self._index
        return [s for s in range(st.first_seq, st.last_seq + 1) if not idx.subject_id(s)]

    def info_state(
        self, consumer_count: int, subjects_filter: str | None = None, deleted_details: bool = False
    ) -> dict[str, Any]:
        st = self.state
        out: dict[str, Any] = {
            "messages": st.messages,
            "bytes": st.bytes,
            "first_seq": st.first_seq,
            "first_ts": rfc3339(st.first_ts if st.messages else 0),
            "last_seq": st.last_seq,
            "last_ts": rfc3339(st.last_ts),
        }
        if self.num_subjects:
            out["num_subjects"] = self.num_subjects
        if subjects_filter:
            counts = self.subject_counts(subjects_filter)
            if counts:
                out["subjects"] = counts
        if deleted_details:
            holes = self.deleted()
            if holes:
                out["num_deleted"] = len(holes)
                out["deleted"] = holes
        elif st.messages and st.last_seq - st.first_seq + 1 > st.messages:
            out["num_deleted"] = st.last_seq - st.first_seq + 1 - st.messages
        if self.lost:
            out["lost"] = {"msgs": self.lost, "bytes": self.lost_bytes}
        out["consumer_count"] = consumer_count
        return out

    def rollback(self) -> None:
        """Forget what was accepted but never committed (the writer failed it): the stream goes back
        to its durable last sequence, so the next publish reuses the lost sequences. Removals the
        lost messages caused (limits) stay: they are in the past of what clients saw."""
        st, idx = self.state, self._index
        while st.last_seq > self.durable_last_seq and idx.end > idx.base and idx.end - 1 == st.last_seq:
            sid, size = idx.pop()
            if sid:
                self._uncount(sid, size)
            st.last_seq -= 1
        st.last_seq = min(st.last_seq, max(self.durable_last_seq, 0))
        self.tail.drop_from(st.last_seq + 1)
        self.dedup.forget_after(st.last_seq)
        self.ttl.forget_after(st.last_seq)
        self._removed = [r for r in self._removed if r[0] <= self.durable_last_seq]
        for r in self._removed:
            r[1] = min(r[1], self.durable_last_seq)
        i = st.last_seq - idx.base
        st.last_ts = idx.ts[i] if 0 <= i < len(idx.ts) else st.last_ts
        if st.messages == 0:
            st.first_seq, st.first_ts = (st.last_seq + 1 if st.last_seq else 0), 0
        elif not idx.subject_id(st.first_seq):
            self._advance_first()
        self.durable_moved.emit()

    def restore_removed(self, first: int, last: int) -> None:
        """Replay a range from the durable removal log at start-up (not recorded again)."""
        idx = self._index
        lo, hi = max(first, idx.base), min(last + 1, idx.end)
        if hi - lo > BULK_RESTORE:
            self._drop_range(lo, hi)
            st = self.state
            if st.messages and lo <= st.first_seq < hi:  # skip the holes at once, not one by one
                rest = np.frombuffer(idx.sid, np.uint32)[hi - idx.base :]
                st.first_seq = hi + int(np.flatnonzero(rest)[0])
                del rest
                self._advance_first()  # its time, and the cut of the holes below it
        else:
            for s in range(lo, hi):
                if idx.subject_id(s):
                    self._drop(s)
        if self.state.messages == 0 or not idx.subject_id(self.state.first_seq):
            self._advance_first()

    def _drop_range(self, lo: int, hi: int) -> None:
        """``_drop`` of every live sequence in ``[lo, hi)`` with array operations: a work-queue
        stream's acked messages come back from the removal log as one long range."""
        idx = self._index
        sid_view = memoryview(idx.sid)[lo - idx.base : hi - idx.base]
        try:
            sids = np.frombuffer(sid_view, np.uint32)
            live = np.flatnonzero(sids)
            gone = sids[live]
            sizes = np.frombuffer(idx.size, np.uint32, hi - lo, (lo - idx.base) * 4)[live]
            sids[live] = 0  # writes through to the index: holes
            del sids
        finally:
            sid_view.release()
        seqs = (live + lo).tolist()
        names = self._subject_names
        if self.msg_removed:
            for seq, sid in zip(seqs, gone.tolist(), strict=True):
                self.msg_removed.emit(seq, names[sid])
        self.tail.drop_seqs(seqs)
        st = self.state
        st.messages -= len(seqs)
        st.bytes -= int(sizes.sum(dtype=np.int64))
        per_subject = np.bincount(gone)
        for sid in np.flatnonzero(per_subject).tolist():
            left = self._subject_counts[sid] - int(per_subject[sid])
            if left:
                self._subject_counts[sid] = left
            else:
                self._forget_subject(sid)
