"""A stream's state machine: sequences, counts and the subject index, with no I/O.

The gateway is the real-time authority: this object answers every question about the stream at
once, and it moves only by ``accept`` (a publish given a sequence) and ``committed``/``rollback``
(what the writer made durable, or failed to).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from gateway.subjects import subject_matches
from gateway.timefmt import rfc3339
from storage_delta.schema import DEFAULT_BLOCK_SIZE, stored_size
from storage_delta.writer import StoredMessage


@dataclass(slots=True)
class StreamState:
    messages: int = 0
    bytes: int = 0
    first_seq: int = 0
    first_ts: int = 0
    last_seq: int = 0
    last_ts: int = 0


class TailCache:
    """The newest messages of a stream, bounded in bytes, so consumers that keep up skip parquet."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[int, StoredMessage] = OrderedDict()

    def put(self, msg: StoredMessage) -> None:
        self._items[msg.seq] = msg
        self._bytes += msg.nbytes
        while self._bytes > self._max_bytes and self._items:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes

    def get(self, seq: int) -> StoredMessage | None:
        return self._items.get(seq)

    def drop_from(self, seq: int) -> None:
        for s in [s for s in self._items if s >= seq]:
            msg = self._items.pop(s)
            self._bytes -= msg.nbytes


class Stream:
    """One stream: its config and the live state derived from what it stored."""

    def __init__(self, config: dict[str, Any], created_ns: int, tail_cache_bytes: int) -> None:
        self.config = config
        self.created_ns = created_ns
        self.block_size = DEFAULT_BLOCK_SIZE
        self.state = StreamState()
        self.durable_last_seq = 0
        self.tail = TailCache(tail_cache_bytes)
        # Subject of every sequence from ``_base``, as an index into ``_subject_names`` (0 = none):
        # four bytes a message lets filtered consumers and counts work without reading Delta.
        self._base = 1
        self._subject_of = array("I")
        self._subject_names: list[str] = [""]
        self._subject_ids: dict[str, int] = {}
        self._subject_counts: dict[int, int] = {}

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def subjects(self) -> list[str]:
        return list(self.config.get("subjects") or [])

    def captures(self, subject: str) -> bool:
        return any(subject_matches(f, subject) for f in self.subjects)

    def _subject_id(self, subject: str) -> int:
        sid = self._subject_ids.get(subject)
        if sid is None:
            sid = len(self._subject_names)
            self._subject_names.append(subject)
            self._subject_ids[subject] = sid
        return sid

    def _index(self, seq: int, subject: str, size: int, ts: int) -> None:
        sid = self._subject_id(subject)
        while self._base + len(self._subject_of) < seq:
            self._subject_of.append(0)  # a gap (e.g. recovered from a compacted table)
        self._subject_of.append(sid)
        self._subject_counts[sid] = self._subject_counts.get(sid, 0) + 1
        st = self.state
        if st.messages == 0:
            st.first_seq, st.first_ts = seq, ts
        st.messages += 1
        st.bytes += size
        st.last_seq, st.last_ts = seq, ts

    def accept(self, subject: str, hdrs: bytes | None, data: bytes, now_ns: int) -> StoredMessage:
        """Give a publish the next sequence and account for it; durable only once committed."""
        seq = self.state.last_seq + 1
        ts = max(now_ns, self.state.last_ts + 1)
        msg = StoredMessage(self.name, self.block_size, seq, ts, subject, hdrs, data)
        self._index(seq, subject, stored_size(subject, hdrs, data), ts)
        self.tail.put(msg)
        return msg

    def restore(self, seq: int, ts: int, subject: str, size: int) -> None:
        """Account for a message found in the table at start-up."""
        self._index(seq, subject, size, ts)
        self.durable_last_seq = seq

    def committed(self, seq: int) -> None:
        self.durable_last_seq = max(self.durable_last_seq, seq)

    def next_matching(self, after: int, filters: list[str]) -> int | None:
        """The first durable sequence above ``after`` whose subject a filter matches (any subject
        when there are no filters); consumers never see a message that is not committed yet."""
        start = max(after + 1, self.state.first_seq, self._base)
        end = min(self._base + len(self._subject_of), self.durable_last_seq + 1)
        if not filters:
            for seq in range(start, end):
                if self._subject_of[seq - self._base]:
                    return seq
            return None
        for seq in range(start, end):
            sid = self._subject_of[seq - self._base]
            if sid and any(subject_matches(f, self._subject_names[sid]) for f in filters):
                return seq
        return None

    def count_matching_after(self, after: int, filters: list[str]) -> int:
        """Messages above ``after`` a consumer with these filters would still get (num_pending)."""
        start = max(after + 1, self.state.first_seq, self._base)
        end = self._base + len(self._subject_of)
        if start >= end:
            return 0
        if not filters:
            return sum(1 for seq in range(start, end) if self._subject_of[seq - self._base])
        matches = {
            sid
            for sid, name in enumerate(self._subject_names)
            if sid and any(subject_matches(f, name) for f in filters)
        }
        return sum(1 for seq in range(start, end) if self._subject_of[seq - self._base] in matches)

    @property
    def num_subjects(self) -> int:
        return sum(1 for c in self._subject_counts.values() if c)

    def info_state(self, consumer_count: int) -> dict[str, Any]:
        st = self.state
        out: dict[str, Any] = {
            "messages": st.messages,
            "bytes": st.bytes,
            "first_seq": st.first_seq if st.messages else st.last_seq + 1 if st.last_seq else 0,
            "first_ts": rfc3339(st.first_ts if st.messages else 0),
            "last_seq": st.last_seq,
            "last_ts": rfc3339(st.last_ts),
        }
        if self.num_subjects:
            out["num_subjects"] = self.num_subjects
        out["consumer_count"] = consumer_count
        return out

    def rollback(self) -> None:
        """Forget what was accepted but never committed (the writer failed it): the stream goes back
        to its durable last sequence, so the next publish reuses the lost sequences."""
        st = self.state
        while st.last_seq > self.durable_last_seq and self._subject_of:
            seq = st.last_seq
            sid = self._subject_of.pop()
            msg = self.tail.get(seq)
            if sid:
                self._subject_counts[sid] -= 1
                st.messages -= 1
                if msg is not None:
                    st.bytes -= stored_size(msg.subject, msg.hdrs, msg.data)
            st.last_seq = seq - 1
        self.tail.drop_from(st.last_seq + 1)
        last = self.tail.get(st.last_seq)
        if last is not None:
            st.last_ts = last.ts
        if st.messages == 0:
            st.first_seq = st.first_ts = 0

    def last_matching(self, filters: list[str]) -> int | None:
        """The newest sequence a filter matches (``deliver_policy: last``)."""
        for seq in range(self._base + len(self._subject_of) - 1, self._base - 1, -1):
            sid = self._subject_of[seq - self._base]
            if sid and (not filters or any(subject_matches(f, self._subject_names[sid]) for f in filters)):
                return seq
        return None

    def last_per_subject(self, filters: list[str]) -> list[int]:
        """The newest sequence of each subject the filters match, ascending (``last_per_subject``)."""
        newest: dict[int, int] = {}
        for i, sid in enumerate(self._subject_of):
            if sid:
                newest[sid] = self._base + i
        return sorted(
            seq
            for sid, seq in newest.items()
            if not filters or any(subject_matches(f, self._subject_names[sid]) for f in filters)
        )
