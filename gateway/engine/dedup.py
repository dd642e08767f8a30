"""The ``Nats-Msg-Id`` duplicate window of one stream, with no I/O.

JetStream remembers the id of every message stored within ``duplicate_window`` and answers a repeat
with the original sequence and ``"duplicate": true`` instead of storing it again. Ids are entered at
accept time (before the commit), so a repeat that arrives while the original is still in flight is a
duplicate too; a failed commit takes its ids back out (:meth:`DedupWindow.forget_after`).

Entries are kept in sequence order, which is also time order, so expiry pops from the front and a
rollback pops from the back: both O(1) per entry.
"""

from __future__ import annotations

from collections import deque


class DedupWindow:
    def __init__(self) -> None:
        self._by_id: dict[str, tuple[int, int]] = {}
        self._order: deque[tuple[str, int, int]] = deque()
        #: The id of the newest stored message ("" when it had none): ``Nats-Expected-Last-Msg-Id``
        #: compares against it.
        self.last_msg_id = ""

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(self, msg_id: str, now_ns: int, window_ns: int) -> int | None:
        """The sequence of the message stored under ``msg_id`` within the window, if any."""
        entry = self._by_id.get(msg_id)
        if entry is None or now_ns - entry[1] >= window_ns:
            return None
        return entry[0]

    def record(self, msg_id: str, seq: int, ts: int, now_ns: int, window_ns: int) -> None:
        """A message was accepted; ``msg_id`` may be empty (it still becomes the last msg id)."""
        self.last_msg_id = msg_id
        if msg_id:
            self._by_id[msg_id] = (seq, ts)
            self._order.append((msg_id, seq, ts))
        self._expire(now_ns, window_ns)

    def _expire(self, now_ns: int, window_ns: int) -> None:
        order = self._order
        while order and now_ns - order[0][2] >= window_ns:
            msg_id, seq, _ = order.popleft()
            if self._by_id.get(msg_id, (0, 0))[0] == seq:
                del self._by_id[msg_id]

    def forget_after(self, seq: int) -> None:
        """Messages above ``seq`` were never stored (their commit failed): drop their ids, and the
        last msg id becomes that of the message at ``seq`` if it had one."""
        order = self._order
        while order and order[-1][1] > seq:
            msg_id, s, _ = order.pop()
            if self._by_id.get(msg_id, (0, 0))[0] == s:
                del self._by_id[msg_id]
        self.last_msg_id = order[-1][0] if order and order[-1][1] == seq else ""
