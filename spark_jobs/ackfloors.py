"""The ack-floor job: every consumer's ack floor, pending count, redelivered count and lag, from the
ack log, appended to the ``ackfloors`` table as one run.

The driver reads the log once (folded, as the gateway's loader reads it) and the catalog; the
executors replay each consumer's rows with the reducer the gateway restores consumers with
(``storage_delta.consumer_log``; one task per group of consumers), so the figures are those the
consumer API would give after a restart.
"""

from __future__ import annotations

import time

from pyspark.sql import SparkSession

from storage_delta.commit.store import StoreRoot
from storage_delta.read.consumer_log import reduce
from storage_delta.tables import acklog
from storage_delta.tables.ackfloors import AckFloorRow, append_run, live_consumers, stream_last_seqs
from storage_delta.tables.removals import load_stream_states


def consumer_row(
    run_ts: int, stream: str, name: str, created: int, records: list[acklog.AckRecord], last_seq: int
) -> AckFloorRow:
    """One consumer's figures, computed on an executor."""
    state = reduce(records, created)
    return AckFloorRow(
        run_ts=run_ts,
        stream=stream,
        consumer=name,
        floor_seq=state.floor_sseq,
        floor_cseq=state.floor_cseq,
        delivered_seq=state.delivered_sseq,
        delivered_cseq=state.delivered_cseq,
        num_ack_pending=len(state.pending),
        num_redelivered=state.num_redelivered,
        stream_last_seq=last_seq,
        lag=max(last_seq - state.floor_sseq, 0),
    )


def ackfloors(spark: SparkSession, root: StoreRoot, partitions: int = 8) -> tuple[int, list[AckFloorRow]]:
    """Compute and append one run; returns the run number and its rows. The catalog is read after
    the log, so every consumer with rows in the snapshot is known (a consumer created meanwhile
    shows with no rows: a fresh state). A store without consumers gets an empty run, and no ack log
    table is created for it."""
    if not live_consumers(root):
        return append_run(root, []), []
    log = acklog.AckLogTable(root).load()
    consumers = live_consumers(root)
    states = load_stream_states(root)
    last = stream_last_seqs(root, states)
    run_ts = time.time_ns()
    tasks = [
        (stream, name, created, log.consumers.get((stream, name), []), last[stream])
        for (stream, name), created in sorted(consumers.items())
        if stream in last
    ]
    rows: list[AckFloorRow] = []
    if tasks:
        rows = (
            spark.sparkContext.parallelize(tasks, min(partitions, len(tasks)))
            .map(lambda t: consumer_row(run_ts, *t))
            .collect()
        )
    return append_run(root, rows), rows
