"""Messages written straight into a stream's Delta table, as a long-lived gateway would have left
them: far faster than publishing a million messages through the gateway, for workloads that measure
what happens to a stream that is already full."""

from __future__ import annotations

from collections.abc import Sequence

from storage_delta.commit.store import StoreRoot
from storage_delta.commit.writer import MessageTable, StoredMessage

COMMIT_ROWS = 100_000


def write_messages(root: StoreRoot, stream: str, subject: str | Sequence[str], count: int, ts0: int) -> None:
    """Sequences 1..``count`` in commits of ``COMMIT_ROWS`` (on the ``subject``, or taking turns on
    the subjects given); the gateway must be stopped, and the stream created through the API
    beforehand (its catalog entry is what recovery starts from)."""
    subjects = [subject] if isinstance(subject, str) else list(subject)
    table = MessageTable(root)
    try:
        version = table.last_txn_version()
        for start in range(1, count + 1, COMMIT_ROWS):
            version += 1
            batch = [
                StoredMessage(
                    stream, 100_000, s, ts0 + s, subjects[s % len(subjects)], None, b"payload-%d" % s
                )
                for s in range(start, min(start + COMMIT_ROWS, count + 1))
            ]
            table.commit(batch, version)
    finally:
        table.close()
