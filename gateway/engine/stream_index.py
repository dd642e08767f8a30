"""Compact per-sequence and per-subject indexes a stream keeps in memory, with no I/O.

A stream answers every count and every "which sequence" question without reading Delta, so it holds
a few bytes per live sequence: the subject id, the stored size and the stored time. Removals leave a
hole (subject id 0); a prefix of holes is cut off in halves so each removal costs O(1) amortized.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict

import numpy as np

from storage_delta.commit.writer import StoredMessage

#: Holes kept below the first live sequence before the arrays are cut (amortizes the cut).
COMPACT_MIN = 4096


class SeqIndex:
    """Subject id, stored size and time of every sequence from ``base``; subject id 0 is a hole."""

    def __init__(self) -> None:
        self.base = 1
        self.sid = array("I")
        self.size = array("I")
        self.ts = array("q")

    @classmethod
    def of(cls, seq: np.ndarray, sid: np.ndarray, size: np.ndarray, ts: np.ndarray) -> SeqIndex:
        """The index of ascending sequences ``seq`` in one go (recovery); missing sequences are holes."""
        index = cls()
        if not len(seq):
            return index
        index.base = int(seq[0])
        width = int(seq[-1]) - index.base + 1
        dense = width == len(seq)
        for name, values, dtype in (("sid", sid, np.uint32), ("size", size, np.uint32), ("ts", ts, np.int64)):
            if dense:
                column = values.astype(dtype, copy=False)
            else:
                column = np.zeros(width, dtype)
                column[seq - index.base] = values
            getattr(index, name).frombytes(column.tobytes())
        return index

    @property
    def end(self) -> int:
        """One past the highest indexed sequence."""
        return self.base + len(self.sid)

    def append(self, seq: int, sid: int, size: int, ts: int) -> None:
        if not self.sid:
            self.base = seq
        elif self.base + len(self.sid) < seq:  # a gap: sequences removed before a restart
            while self.end < seq:
                self.sid.append(0)
                self.size.append(0)
                self.ts.append(0)
        self.sid.append(sid)
        self.size.append(size)
        self.ts.append(ts)

    def extend(self, first: int, sids: array[int], sizes: array[int], ts: array[int]) -> None:
        """``append`` for consecutive sequences from ``first``, one array each."""
        self.append(first, sids[0], sizes[0], ts[0])
        self.sid.extend(sids[1:])
        self.size.extend(sizes[1:])
        self.ts.extend(ts[1:])

    def subject_id(self, seq: int) -> int:
        """The subject id of a live sequence, 0 for a hole or a sequence outside the index."""
        i = seq - self.base
        return self.sid[i] if 0 <= i < len(self.sid) else 0

    def pop(self) -> tuple[int, int]:
        """Drop the highest sequence (a rollback); its (subject id, size)."""
        self.ts.pop()
        return self.sid.pop(), self.size.pop()

    def compact(self, first_live: int) -> None:
        """Cut the holes below ``first_live`` once they are many and at least half the index."""
        cut = first_live - self.base
        if cut >= COMPACT_MIN and cut * 2 >= len(self.sid):
            del self.sid[:cut]
            del self.size[:cut]
            del self.ts[:cut]
            self.base = first_live


class SubjectSeqs:
    """Sequences of one subject, ascending, removed ones dropped lazily from either end; a head
    offset makes dropping the oldest O(1) amortized."""

    __slots__ = ("head", "seqs")

    def __init__(self, seqs: np.ndarray | None = None) -> None:
        self.seqs = array("q")
        if seqs is not None:
            self.seqs.frombytes(seqs.astype(np.int64).tobytes())
        self.head = 0

    def add(self, seq: int) -> None:
        self.seqs.append(seq)

    def trim(self, live: SeqIndex, sid: int) -> None:
        """Drop dead entries at both ends, so ``oldest``/``newest`` are live."""
        while self.head < len(self.seqs) and live.subject_id(self.seqs[self.head]) != sid:
            self.head += 1
        while len(self.seqs) > self.head and live.subject_id(self.seqs[-1]) != sid:
            self.seqs.pop()
        if self.head >= COMPACT_MIN and self.head * 2 >= len(self.seqs):
            del self.seqs[: self.head]
            self.head = 0

    def oldest(self) -> int:
        return self.seqs[self.head] if self.head < len(self.seqs) else 0

    def newest(self) -> int:
        return self.seqs[-1] if len(self.seqs) > self.head else 0

    def first_at_or_after(self, seq: int, live: SeqIndex, sid: int) -> int:
        """The first live sequence of this subject at or above ``seq``, 0 when none."""
        i = bisect_left(self.seqs, seq, self.head)
        while i < len(self.seqs):
            if live.subject_id(self.seqs[i]) == sid:
                return self.seqs[i]
            i += 1
        return 0

    def last_at_or_below(self, upto: int, live: SeqIndex, sid: int) -> int:
        """The newest live sequence of this subject at or below ``upto``, 0 when none."""
        i = bisect_right(self.seqs, upto, self.head) - 1
        while i >= self.head:
            if live.subject_id(self.seqs[i]) == sid:
                return self.seqs[i]
            i -= 1
        return 0

    def live_upto(self, upto: int, live: SeqIndex, sid: int) -> list[int]:
        """Live sequences of this subject at or below ``upto``, ascending."""
        stop = bisect_left(self.seqs, upto + 1, self.head)
        return [s for s in self.seqs[self.head : stop] if live.subject_id(s) == sid]


class TailCache:
    """The newest messages of a stream, bounded in bytes, so consumers that keep up skip parquet."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[int, StoredMessage] = OrderedDict()

    def put(self, msg: StoredMessage) -> None:
        self._items[msg.seq] = msg
        self._bytes += msg.nbytes
        self._evict()

    def put_many(self, msgs: list[StoredMessage]) -> None:
        items = self._items
        for msg in msgs:
            items[msg.seq] = msg
        self._bytes += sum(m.nbytes for m in msgs)
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self._max_bytes and self._items:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes

    def get(self, seq: int) -> StoredMessage | None:
        return self._items.get(seq)

    def drop(self, seq: int) -> None:
        msg = self._items.pop(seq, None)
        if msg is not None:
            self._bytes -= msg.nbytes

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def drop_seqs(self, seqs: list[int]) -> None:
        """Drop these sequences (those it holds: it holds few, so the smaller side is walked)."""
        if not self._items:
            return
        if len(seqs) > len(self._items):
            wanted = set(seqs)
            seqs = [s for s in self._items if s in wanted]
        for s in seqs:
            self.drop(s)

    def drop_from(self, seq: int) -> None:
        for s in [s for s in self._items if s >= seq]:
            self.drop(s)
