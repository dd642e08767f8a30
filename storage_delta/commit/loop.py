"""The one group-commit loop: whatever arrived while a commit was in flight forms the next commit.

Both writers of the gateway's hot path (messages, ack log) are thin fronts over :class:`CommitLoop`;
what differs between them is a few numbers (how long rows may wait for company, how long a failed
commit is retried), not the rules. The rules (docs/storage.md):

* rows become durable in submission order, one Delta version per commit, each version tagged with
  the next txn version so that a retry lands once (:class:`~storage_delta.commit.append.TableAppender`);
* a waiter is answered only after the commit holding its rows (and every row before them) landed;
* **one failure policy**: a commit that raised is first checked against the table (an error can hide a
  success, delta-rs #2509); if it did not land it is tried again with the same version, backing off,
  for up to ``retry_s``; then it fails, together with everything queued behind it (later rows may
  depend on it: a stream's later sequences, a consumer's later acks), every waiter of those rows gets
  the error, and the owner's ``on_failure`` puts its view back to what is durable;
* **a waiter never hangs**: if the loop itself breaks (a bug, not a failed commit) it asks the table
  whether the batch in hand landed (then it is committed) or not (then it fails, with
  :class:`CommitLoopDied`), logs what broke, counts a restart and starts over from what the table
  holds; if the table cannot say (reading it fails too), the loop stops for good, loudly, and fails
  everything it holds; if its task ends any other way than :meth:`close`, a done-callback fails the
  waiters;
* **a fenced writer stops** (:class:`~storage_delta.commit.owner.Fenced`: a newer owner of the store
  committed meanwhile): nothing is retried and no landed check is trusted (the new owner's versions
  are not ours); ``on_fenced`` hears of it first, then everything held fails with the error;
* **a fenced stream is dropped, not the writer** (per-stream ownership: ``commit`` returns the streams
  a newer owner fenced, having committed the other streams' rows): ``on_stream_fenced`` hears of them
  first, then their rows roll back (``on_failure``) and the waiters of those streams fail with
  :class:`~storage_delta.commit.owner.StreamFenced` (and the waiters that named no stream: they
  waited for every row before them); the other waiters are answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Generic, TypeVar

from storage_delta.commit.owner import Fenced, LeftOutThenFailed, StreamFenced
from storage_delta.commit.stats import BATCH_SIZE_BUCKETS, COMMIT_SECONDS_BUCKETS, Histogram

log = logging.getLogger(__name__)

Row = TypeVar("Row")

#: Back-off between tries of a failed commit: from the first to the cap, doubling.
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 2.0
#: Pause before a broken loop starts over, so a fault that repeats does not spin.
RESTART_PAUSE_S = 0.1


class CommitLoopDied(Exception):
    """The commit loop broke or stopped before these rows were committed."""


class OutcomeUnknown(Exception):
    """A commit failed and the table cannot say whether it landed (reading it fails too)."""


class CommitLoop(Generic[Row]):
    """Owns one commit task. Fronts append rows to :attr:`pending` and call :meth:`queued`.

    ``drained(rows)`` is told, on the event loop, of every run of rows that leaves the queue (taken
    for a commit, in order, or failed): fronts keep their bounds and numbering with it. ``commit``
    runs on ``executor`` and may be called again for the same batch and version after an error.
    ``committed(rows)`` hears of each landed batch, on the event loop. ``rows_of`` says how many
    table rows an item of :attr:`pending` stands for (the ack log queues runs of rows as columns),
    one each without it; :attr:`pending_rows` counts them."""

    def __init__(
        self,
        name: str,
        executor: Executor,
        commit: Callable[[list[Row], int], frozenset[str] | None],
        committed_version: Callable[[], int],
        on_failure: Callable[[list[Row], BaseException], None],
        *,
        linger_s: float = 0.0,
        gather_rows: int = 0,
        retry_s: float = 0.0,
        committed: Callable[[list[Row]], None] | None = None,
        drained: Callable[[list[Row]], None] | None = None,
        stream_of: Callable[[Row], str] | None = None,
        rows_of: Callable[[Row], int] | None = None,
    ) -> None:
        self.name = name
        self._executor = executor
        self._commit_rows = commit
        self._committed_version = committed_version
        self._on_failure = on_failure
        self._committed = committed
        self._drained = drained
        #: Told first when a commit finds the writer fenced (set by the owner of the store's lease).
        self.on_fenced: Callable[[Fenced], None] | None = None
        #: Told first when a commit left out streams a newer owner fenced (per-stream ownership).
        self.on_stream_fenced: Callable[[frozenset[str]], None] | None = None
        #: A row's stream, for per-stream ownership (which rows a fenced stream rolls back).
        self._stream_of = stream_of
        self._rows_of = rows_of
        #: The stream a waiter waits for, when it named one (per-stream ownership).
        self._waiter_streams: dict[asyncio.Future[None], str] = {}
        self._linger_s = linger_s
        self._gather_rows = gather_rows
        self._retry_s = retry_s
        self.pending: list[Row] = []
        #: The table rows :attr:`pending` holds (what fronts add as ``queued``'s ``added``).
        self.pending_rows = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._in_flight: list[asyncio.Future[None]] = []
        self._batch: list[Row] = []
        self._batch_version = 0
        self._urgent = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._version = 0
        self.commits = 0
        self.rows_committed = 0
        self.failures = 0  # commits given up on (their rows failed)
        self.restarts = 0  # times the loop broke and started over
        self.commit_seconds = Histogram(COMMIT_SECONDS_BUCKETS)
        self.batch_rows = Histogram(BATCH_SIZE_BUCKETS)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._version = await loop.run_in_executor(self._executor, self._committed_version)
        self._task = asyncio.create_task(self._run(), name=f"{self.name}-commit")
        self._task.add_done_callback(self._ended)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> bool:
        """The loop is alive and takes rows."""
        return not self._closed and self._task is not None and not self._task.done()

    def queued(self, sync: bool, added: int = 1, stream: str | None = None) -> asyncio.Future[None] | None:
        """Rows were appended to :attr:`pending`. With ``sync`` the returned future resolves once
        they (and every row before them) are committed; it resolves at once when nothing is owed.
        Rows without a waiter may wait up to ``linger_s`` for company. ``stream``: the rows are
        all of that stream, so only its fence fails the future (per-stream ownership)."""
        self.pending_rows += added
        if not sync:
            # The loop waits for the first row, then for the linger time or enough rows: waking it
            # for each row in between would only cost it a new timer each time.
            if self.pending_rows <= added or self._ready():
                self._wakeup.set()
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._task is not None and self._task.done():
            fut.set_exception(CommitLoopDied(f"{self.name} commit loop has stopped"))
            return fut
        if not self.pending and not self._batch:
            fut.set_result(None)
            return fut
        self._waiters.append(fut)
        if stream is not None:
            self._waiter_streams[fut] = stream
            fut.add_done_callback(self._forget_stream)
        self._urgent = True
        self._wakeup.set()
        return fut

    def _forget_stream(self, fut: asyncio.Future[None]) -> None:
        self._waiter_streams.pop(fut, None)

    async def flush(self) -> None:
        """Wait until every row queued so far is committed."""
        fut = self.queued(sync=True, added=0)
        assert fut is not None
        await fut

    def _ready(self) -> bool:
        return (
            self._urgent
            or self._closed
            or self._linger_s <= 0
            or (self._gather_rows > 0 and self.pending_rows >= self._gather_rows)
        )

    async def _gather(self) -> None:
        """Wait for work; rows without a waiter wait up to the linger time for company. A closed
        loop does not wait: it drains what is queued and stops."""
        if not self._closed:
            await self._wakeup.wait()
        self._wakeup.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._linger_s
        while self.pending and not self._ready():
            try:
                await asyncio.wait_for(self._wakeup.wait(), deadline - loop.time())
            except TimeoutError:
                return
            self._wakeup.clear()

    async def _run(self) -> None:
        try:
            while not (self._closed and not self.pending and not self._waiters):
                try:
                    await self._cycle()
                except (OutcomeUnknown, Fenced):
                    raise
                except Exception as exc:  # the loop's own fault, not a failed commit (handled)
                    log.exception("%s commit loop broke; failing its waiters and starting over", self.name)
                    self.restarts += 1
                    await self._recover(CommitLoopDied(f"{self.name} commit loop broke: {exc!r}"))
        except (OutcomeUnknown, Fenced) as exc:
            self._stop(exc)

    def _stop(self, exc: OutcomeUnknown | Fenced) -> None:
        """Whether a commit landed cannot be known, or the writer was fenced: the loop stops for
        good (loudly: the log, ``running`` False, ``/healthz``). Everything it held fails and its
        owner rolls back, which is safe only because nothing is taken any more; a restart (or the
        new owner) reads what landed."""
        log.error("%s commit loop stops: %s", self.name, exc, exc_info=exc.__cause__)
        self._closed = True
        broken, self._batch = self._batch, []
        if isinstance(exc, Fenced):
            if self.on_fenced is not None:
                self.on_fenced(exc)  # first: the owner stops answering before waiters hear
            self._fail(broken, exc)
            return
        self._fail(broken, CommitLoopDied(f"{self.name} commit loop stopped: {exc}"))

    async def _cycle(self) -> None:
        await self._gather()
        batch, self._in_flight = self.pending, self._waiters
        self.pending, self.pending_rows, self._waiters, self._urgent = [], 0, [], False
        self._batch, self._batch_version = batch, self._version + 1
        if self._drained is not None:
            self._drained(batch)
        if batch and not await self._commit(batch):
            self._batch = []
            return
        self._batch = []
        waiters, self._in_flight = self._in_flight, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _recover(self, exc: CommitLoopDied) -> None:
        """After a break, the table says what happened to the batch in hand: if its version landed
        it is committed (its waiters are answered so, nothing rolls back: a rollback would give its
        sequences out again); if not, it fails as a failed commit does. Then start over from the
        table's version."""
        landed = await self._landed()
        broken, self._batch = self._batch, []
        if broken and landed >= self._batch_version:
            waiters, self._in_flight = self._in_flight, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            broken = []
        self._fail(broken, exc)
        await asyncio.sleep(RESTART_PAUSE_S)
        self._version = max(self._version, await self._landed())

    async def _commit(self, batch: list[Row]) -> bool:
        """Commit ``batch`` under the failure policy; False when it failed (and what was queued
        behind it failed with it)."""
        loop = asyncio.get_running_loop()
        version = self._version + 1
        started = time.perf_counter()
        delay = RETRY_FIRST_S
        fenced: frozenset[str] | None = None
        while True:
            try:
                fenced = await loop.run_in_executor(self._executor, self._commit_rows, batch, version)
                break
            except Fenced:
                raise
            except Exception as exc:
                landed = await self._landed()
                if landed >= version:
                    # the error came after the commit landed (delta-rs #2509), without the rows
                    # of the streams it found fenced, if any
                    fenced = exc.streams if isinstance(exc, LeftOutThenFailed) else None
                    break
                if self._closed or time.perf_counter() - started + delay > self._retry_s:
                    log.exception("%s commit of %d rows failed", self.name, self._rows(batch))
                    self.failures += 1
                    self._version = landed
                    self._fail(batch, exc)
                    return False
                log.warning("%s commit of %d rows failed (%r); retrying", self.name, self._rows(batch), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_S)
        self._version = version
        if fenced:
            batch = self._drop_fenced(batch, fenced)
        self.commits += 1
        rows = self._rows(batch)
        self.rows_committed += rows
        self.commit_seconds.observe(time.perf_counter() - started)
        self.batch_rows.observe(rows)
        if self._committed is not None:
            self._committed(batch)
        return True

    def _rows(self, batch: list[Row]) -> int:
        rows_of = self._rows_of
        return len(batch) if rows_of is None else sum(map(rows_of, batch))

    def _drop_fenced(self, batch: list[Row], fenced: frozenset[str]) -> list[Row]:
        """A commit left out the rows of ``fenced`` streams (a newer owner holds them): the
        owner hears first, the rows roll back and the waiters of those streams fail; the rows
        committed are returned."""
        exc = StreamFenced(fenced)
        log.warning("%s: %s", self.name, exc)
        if self.on_stream_fenced is not None:
            self.on_stream_fenced(fenced)
        stream_of = self._stream_of
        assert stream_of is not None, "a commit fenced streams of a loop that cannot tell rows' streams"
        dropped = [r for r in batch if stream_of(r) in fenced]
        self._on_failure(dropped, exc)
        kept: list[asyncio.Future[None]] = []
        for w in self._in_flight:
            if self._waiter_streams.get(w, "") in fenced or w not in self._waiter_streams:
                if not w.done():
                    w.set_exception(exc)
            else:
                kept.append(w)
        self._in_flight = kept
        return [r for r in batch if stream_of(r) not in fenced]

    async def _landed(self) -> int:
        """The newest version the table holds; :class:`OutcomeUnknown` when it cannot say."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._committed_version)
        except Fenced:
            raise
        except Exception as exc:
            raise OutcomeUnknown("the table cannot say which commits landed") from exc

    def _fail(self, batch: list[Row], exc: BaseException) -> None:
        """``batch`` (the failed commit's rows) and everything queued behind it fail: the owner
        puts its view back to what is durable, then every waiter gets ``exc``."""
        behind, self.pending, self.pending_rows = self.pending, [], 0
        if self._drained is not None:
            self._drained(behind)
        try:
            if batch or behind:
                self._on_failure(batch + behind, exc)
        finally:
            waiters = self._in_flight + self._waiters
            self._in_flight, self._waiters, self._urgent = [], [], False
            for w in waiters:
                if not w.done():
                    w.set_exception(exc)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The task ended: after :meth:`close` nothing is owed; any other end fails the waiters."""
        if task.cancelled() or not self._closed:
            self._closed = True
            log.error("%s commit loop stopped unexpectedly", self.name)
            broken, self._batch = self._batch, []
            self._fail(broken, CommitLoopDied(f"{self.name} commit loop stopped"))

    async def close(self) -> None:
        """Commit what was queued, then stop."""
        self._closed = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
