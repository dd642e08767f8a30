"""Who may write a store: an owner lease with an epoch, and the fence every commit checks.

Several gateways may share one store root; one owns it at a time (docs/architecture.md, "Several
gateways on one store"). Two parts, with different jobs:

* **the lease** (:mod:`storage_delta.commit.lease`) decides who should own: each epoch has exactly
  one claimant (put-if-absent), the owner beats, a standby claims the next epoch when the beat
  stops. Timing only decides *when* to take over;
* **the fence** makes a late writer harmless whatever the timing: a new owner first commits an
  app transaction ``(jetlake-owner, n)`` to every table it writes, before it reads any of them to
  recover; every commit of an owner carries its epoch the same way. A commit claims its log
  version by put-if-absent, and a writer that finds versions taken reads them before it tries the
  next: an epoch above its own there means it was fenced (:class:`Fenced`), and it stops without
  committing or answering. Versions are contiguous, so a stale writer cannot reach a free version
  without passing the fence, and what the new owner recovered is everything the old one committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: The app id of the owner epoch in every table's Delta log.
OWNER_APP = "jetlake-owner"


class Fenced(Exception):
    """A newer owner epoch is in the table: this writer lost the store and must not commit."""


def check_epoch(found: int, mine: int | None) -> None:
    """Raise :class:`Fenced` when a table's owner epoch ``found`` is past the writer's ``mine``."""
    if mine is not None and found > mine:
        raise Fenced(f"owner epoch {found} took over from epoch {mine}")


# --- Per-stream ownership (docs/architecture.md, "Per-stream ownership"; docs/perstream-status.md) ---
#
# Each stream gets a lease of its own, and the fence moves into the commit per stream: a commit
# carries ``(jetlake-owner/<S>, n)`` for every stream ``S`` whose rows it holds, and a new owner of
# ``S`` first commits its ``(jetlake-owner/<S>, n)`` alone to each table it writes. A writer meeting
# a higher epoch of ``S`` on its way to a free version must drop ``S``'s rows, and only those: the
# other streams of the same group commit still commit (:class:`StreamFenced`).


def stream_owner_app(stream: str) -> str:
    """The app id of ``stream``'s owner epoch in a table's Delta log."""
    return f"{OWNER_APP}/{stream}"


def stream_of_owner_app(app_id: str) -> str | None:
    """The stream whose owner epoch ``app_id`` is (None: another app id)."""
    prefix = f"{OWNER_APP}/"
    return app_id[len(prefix) :] if app_id.startswith(prefix) else None


#: A stream's dedup txn versions (its commits' count in a table, fenced per stream) under owner
#: epoch ``e`` start above ``e << STREAM_COUNT_BITS``: above every version of an older epoch
#: (none makes 2**40 commits), with nothing read of the table.
STREAM_COUNT_BITS = 40


def stream_count_base(epoch: int) -> int:
    """Where the owner of ``epoch`` of a stream counts its commits of the stream from, in every
    table: the stream's versions keep growing across owners (the landed check, the catalog's
    ``rev``), and a new owner learns it without asking the table (one ask per stream, each a
    scan of the table's app transactions, made a restart's claims grow with the streams)."""
    return epoch << STREAM_COUNT_BITS


class StreamFenced(Exception):
    """Newer owners hold ``streams`` (or this writer never held them): their rows must not be
    committed by this writer. Unlike :class:`Fenced` it is not final for the writer: the rows of
    the other streams of the commit may be committed without these."""

    def __init__(self, streams: frozenset[str]) -> None:
        super().__init__(f"streams fenced by a newer owner: {', '.join(sorted(streams))}")
        self.streams = streams


class LeftOutThenFailed(Exception):
    """A commit left out the rows of fenced ``streams`` and then failed (it may still have landed,
    delta-rs #2509): whoever checks that it landed needs to know what it left out."""

    def __init__(self, streams: frozenset[str]) -> None:
        super().__init__(f"commit without the fenced streams {', '.join(sorted(streams))} failed")
        self.streams = streams


def commit_without_fenced(attempt: Callable[[frozenset[str]], None]) -> frozenset[str]:
    """Run ``attempt(left_out)`` (a commit of a batch's rows but those of the ``left_out``
    streams, idempotent by its txn version) until it commits, leaving out every stream it finds
    fenced; returns those. An error after streams were left out is :class:`LeftOutThenFailed`."""
    fenced: frozenset[str] = frozenset()
    while True:
        try:
            attempt(fenced)
            return fenced
        except StreamFenced as exc:
            fenced |= exc.streams
        except Exception as exc:
            if fenced:
                raise LeftOutThenFailed(fenced) from exc
            raise


class StreamEpochs:
    """The stream leases one writer (a gateway) holds: stream name → the epoch it claimed. Shared
    by that writer's appenders; :meth:`hold` is called after the claim and before the stream's
    fences are committed, :meth:`drop` when the stream is handed over or found fenced. Reads come
    from commit threads, writes from the owner: each is one dict operation, atomic in CPython."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def hold(self, stream: str, epoch: int) -> None:
        self._held[stream] = epoch

    def drop(self, stream: str) -> None:
        self._held.pop(stream, None)

    def epoch(self, stream: str) -> int | None:
        """The epoch held for ``stream`` (None: not held, so not writable)."""
        return self._held.get(stream)

    def streams(self) -> frozenset[str]:
        return frozenset(self._held)

    def fenced(self, touched: Iterable[str], table_epoch: Callable[[str], int]) -> frozenset[str]:
        """Of the streams ``touched`` by a commit, those it must not write: not held, or held
        under an epoch below the one ``table_epoch`` finds in the table."""
        out = set()
        for stream in touched:
            mine = self._held.get(stream)
            if mine is None or table_epoch(stream) > mine:
                out.add(stream)
        return frozenset(out)

    def txns(self, touched: Iterable[str]) -> list[tuple[str, int]]:
        """The owner epochs a commit of ``touched`` carries (held streams only; check first)."""
        return [
            (stream_owner_app(s), e) for s in sorted(set(touched)) if (e := self._held.get(s)) is not None
        ]
