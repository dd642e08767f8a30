"""Turns consumer state changes into ack log rows: the thin adapter between the consumer state
machines and :class:`~storage_delta.acklog.AckLogWriter`.

Each method is called right after the state machine made the change, so the row carries the
consumer's positions (last delivered, ack floor) as they now stand. Lifecycle rows (create,
config, delete) are not awaited: the catalog's commit, durable before the API answers, is what a
restart reads of a consumer's definition (#23); a reset is awaited. Deliveries and plain
acks are committed within the writer's flush interval; an ack with a reply gets a future that
resolves once its row is committed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.api.configs import to_json
from gateway.api.timefmt import now_ns
from gateway.engine.consumer import Consumer, Delivered
from storage_delta.read.consumer_log import ConsumerState
from storage_delta.tables import acklog as al


class AckRecorder:
    def __init__(self, writer: al.AckLogWriter) -> None:
        self.writer = writer
        #: Whether the ack log takes more rows (asked once per delivery and once per ack).
        self.has_room = writer.has_room

    @staticmethod
    def _row(
        consumer: Consumer,
        kind: str,
        seq: int = 0,
        cseq: int = 0,
        deliveries: int = 0,
        ts: int = 0,
        **body: Any,
    ) -> al.AckRecord:
        return al.AckRecord(
            stream=consumer.stream.name,
            consumer=consumer.name,
            kind=kind,
            seq=seq,
            cseq=cseq,
            deliveries=deliveries,
            ts=ts or now_ns(),
            delivered_seq=consumer.sseq,
            delivered_cseq=consumer.dseq,
            floor_seq=consumer.ack_floor_sseq,
            floor_cseq=consumer.ack_floor_cseq,
            body=json.dumps(body, separators=(",", ":"), default=to_json) if body else None,
        )

    async def _durable(self, record: al.AckRecord) -> None:
        fut = self.writer.submit(record, sync=True)
        assert fut is not None
        await fut

    def created(self, consumer: Consumer, start_after: int, skip: list[int]) -> int:
        """The start of the consumer's incarnation, ahead of its other rows, not awaited by the
        create (``Registry.add_consumer``); returns its lsn (:meth:`durable_through`)."""
        self.writer.submit(
            self._row(
                consumer,
                al.CREATE,
                config=consumer.config,
                created=consumer.created_ns,
                start_after=start_after,
                skip=skip,
            )
        )
        return self.writer.last_lsn

    async def durable_through(self, lsn: int) -> None:
        """Return once the row of ``lsn`` is committed (at once if it is)."""
        if lsn > self.writer.committed_lsn:
            await self.writer.flush()

    async def restored(self, stream: str, name: str, state: ConsumerState) -> list[al.AckRecord]:
        """A consumer restored from a stream archive: its create, a ``state`` row with its
        positions and redelivered messages, and a delivery row per pending message (stamped with
        the time its ack wait began), all durable on return. The rows are returned: the reducer
        rebuilds the consumer from them, as recovery will from the log."""

        def row(
            kind: str, seq: int = 0, cseq: int = 0, deliveries: int = 0, ts: int = 0, **body: Any
        ) -> al.AckRecord:
            return al.AckRecord(
                stream,
                name,
                kind,
                seq,
                cseq,
                deliveries,
                ts or now,
                state.delivered_sseq,
                state.delivered_cseq,
                state.floor_sseq,
                state.floor_cseq,
                json.dumps(body, separators=(",", ":"), default=to_json) if body else None,
            )

        now = now_ns()
        create: dict[str, Any] = {
            "config": state.config,
            "created": state.created_ns,
            "start_after": state.start_after,
            "skip": state.skip,
        }
        records = [row(al.CREATE, **create), row(al.STATE, redelivered=sorted(state.redelivered))]
        records += [
            row(al.DELIVER, s, p.cseq, p.deliveries, p.since_ns) for s, p in sorted(state.pending.items())
        ]
        for record in records[:-1]:
            self.writer.submit(record)
        await self._durable(records[-1])
        return records

    def config_changed(self, consumer: Consumer) -> None:
        """The new config, for the log's readers (compaction folds it into the state row); a
        restart takes the catalog's (``Registry.update_consumer``)."""
        self.writer.submit(self._row(consumer, al.CONFIG, config=consumer.config))

    async def reset(self, consumer: Consumer) -> None:
        """``CONSUMER.RESET``: it starts again after its (new) delivered stream sequence."""
        await self._durable(self._row(consumer, al.RESET, start_after=consumer.sseq, skip=[]))

    def deleted(self, consumer: Consumer) -> None:
        """The consumer's end, for the ack log's compaction; not waited for (#23): the catalog's
        deletion, durable before the API answers, is what ends a consumer. Should this row be
        lost in a crash, the restart does not restore the consumer (the catalog lacks it) and
        compaction drops its rows as those of a consumer the catalog does not have; a consumer
        made again under the name starts from its own later create row."""
        self.writer.submit(self._row(consumer, al.DELETE))

    @staticmethod
    def _positions(consumer: Consumer) -> tuple[int, int, int, int]:
        return consumer.sseq, consumer.dseq, consumer.ack_floor_sseq, consumer.ack_floor_cseq

    def dropped(self, consumer: Consumer, seq: int) -> None:
        """``seq`` left the pending set unacknowledged (deliveries ran out, or it is gone)."""
        self.writer.add(
            consumer.stream.name, consumer.name, al.DROP, seq, 0, 0, now_ns(), self._positions(consumer)
        )

    def acked_run(self, consumer: Consumer, settled: list[tuple[int, int, int]]) -> None:
        """Record the plain acks of :meth:`Consumer.ack_run` that settled a message, one row each
        with the positions right after it, stamped with the run's ack time: one run of columns."""
        if settled:
            seqs, floor_seqs, floor_cseqs = zip(*settled, strict=True)
            self.writer.add_run(
                al.AckRun(
                    consumer.stream.name,
                    consumer.name,
                    al.ACK,
                    len(settled),
                    seqs,
                    0,
                    0,
                    consumer.ack_floor_active_ns,
                    consumer.sseq,
                    consumer.dseq,
                    floor_seqs,
                    floor_cseqs,
                )
            )

    def delivered_run(self, consumer: Consumer, run: list[Delivered]) -> None:
        """Record deliveries (of :meth:`Consumer.deliver_run` or ``deliver``), one row each, as one
        run of columns (a delivery's consumer sequence is also the delivered one after it)."""
        if run:
            seqs, cseqs, deliveries, _, sseqs, floor_seqs, floor_cseqs = zip(*run, strict=True)
            self.writer.add_run(
                al.AckRun(
                    consumer.stream.name,
                    consumer.name,
                    al.DELIVER,
                    len(run),
                    seqs,
                    cseqs,
                    deliveries,
                    consumer.last_active_ns,
                    sseqs,
                    cseqs,
                    floor_seqs,
                    floor_cseqs,
                )
            )

    def room(self) -> int:
        """How many more frequent rows the ack log takes now."""
        return self.writer.room()

    def acked(
        self, consumer: Consumer, kind: str, seq: int, changed: bool, sync: bool, **body: Any
    ) -> asyncio.Future[None] | None:
        """Record an ack of ``kind`` that ``changed`` the state (or not: a late duplicate). With
        ``sync`` the future resolves when it, or for a duplicate everything before it, is durable."""
        if not changed:
            return self.writer.submit(None, sync=True) if sync else None
        # The ack floor's last_active is the ack's time: the row keeps it exactly for a restart.
        ts = (consumer.ack_floor_active_ns if kind in (al.ACK, al.TERM) else 0) or now_ns()
        if body:
            return self.writer.submit(self._row(consumer, kind, seq, ts=ts, **body), sync=sync)
        return self.writer.add(
            consumer.stream.name, consumer.name, kind, seq, 0, 0, ts, self._positions(consumer), sync
        )
