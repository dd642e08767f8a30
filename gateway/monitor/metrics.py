"""``/metrics``: the gateway's counters and the API's stream and consumer numbers in Prometheus text.

Nothing here counts anything: the components keep their own counters (the writer its commit
histograms, the publish path its publishes and PubAck latencies, the leaf its reconnects, the
compactor its rounds) and this module only reads them when scraped, together with a
:class:`~gateway.jsz.Snapshot` of the API's answers and the monitor's
:class:`~gateway.monitor.lake.LakeReport` (the tables, read at most every few seconds).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gateway.monitor.jsz import Snapshot
from gateway.monitor.lake import LakeReport
from storage_delta.commit.stats import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Counters:
    """The gateway-wide counters at scrape time (read from the components that keep them)."""

    publishes: int
    publish_errors: int
    commits: int
    messages_committed: int
    refused: int
    commit_seconds: Histogram
    batch_messages: Histogram
    acklog_commits: int
    acklog_rows: int
    acklog_compactions: int
    api_dropped: int
    leaf_connected: bool
    leaf_reconnects: int
    leaf_dropped_writes: int
    puback_seconds: Histogram
    stored: Mapping[str, int]  # stream -> messages made durable
    deliveries: Mapping[tuple[str, str], int]  # (stream, consumer) -> deliveries so far


def _histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    buckets = [("+Inf" if b == float("inf") else repr(float(b)), n) for b, n in hist.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=hist.total)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


# (metric suffix, help, how to read it from a STREAM.INFO answer's state)
STREAM_GAUGES = (
    ("messages", "Messages in the stream", "messages"),
    ("bytes", "Bytes stored for the stream, counted as JetStream counts them", "bytes"),
    ("first_seq", "First sequence in the stream", "first_seq"),
    ("last_seq", "Last sequence in the stream", "last_seq"),
    ("consumers", "Consumers of the stream", "consumer_count"),
)
# (metric suffix, help, path into a CONSUMER.INFO answer)
CONSUMER_GAUGES = (
    ("num_pending", "Messages the consumer has not been delivered yet", ("num_pending",)),
    ("num_ack_pending", "Messages delivered and awaiting an ack", ("num_ack_pending",)),
    ("num_redelivered", "Pending messages delivered more than once", ("num_redelivered",)),
    ("num_waiting", "Waiting pull requests", ("num_waiting",)),
    ("ack_floor_stream_seq", "Stream sequence of the ack floor", ("ack_floor", "stream_seq")),
    ("ack_floor_consumer_seq", "Consumer sequence of the ack floor", ("ack_floor", "consumer_seq")),
    ("delivered_stream_seq", "Last stream sequence delivered", ("delivered", "stream_seq")),
    ("delivered_consumer_seq", "Last consumer sequence delivered", ("delivered", "consumer_seq")),
)


def _stream_families(snap: Snapshot) -> Iterator[Metric]:
    for suffix, doc, key in STREAM_GAUGES:
        fam = GaugeMetricFamily(f"jetlake_stream_{suffix}", doc, labels=["stream"])
        for view in snap.streams:
            fam.add_metric([view.name], float(view.info["state"][key]))
        yield fam


def _consumer_families(snap: Snapshot) -> Iterator[Metric]:
    for suffix, doc, path in CONSUMER_GAUGES:
        fam = GaugeMetricFamily(f"jetlake_consumer_{suffix}", doc, labels=["stream", "consumer"])
        for view in snap.streams:
            for info in view.consumers:
                value: object = info
                for key in path:
                    value = value[key]  # type: ignore[index]
                fam.add_metric([view.name, str(info["name"])], float(value))  # type: ignore[arg-type]
        yield fam
    lag = GaugeMetricFamily(
        "jetlake_consumer_lag",
        "Stream last sequence minus the consumer's ack floor (stream sequence)",
        labels=["stream", "consumer"],
    )
    for view in snap.streams:
        for info in view.consumers:
            lag.add_metric([view.name, str(info["name"])], float(consumer_lag(view.last_seq, info)))
    yield lag


def consumer_lag(last_seq: int, consumer_info: dict[str, object]) -> int:
    """How far the ack floor trails the stream: what a consumer still owes, acked or not."""
    floor = consumer_info["ack_floor"]
    assert isinstance(floor, dict)
    return max(0, last_seq - int(floor["stream_seq"]))


def _job_families(lake: LakeReport) -> Iterator[Metric]:
    """What the maintenance jobs left in the ``jobruns`` table (they run in their own process)."""
    jobs = lake.jobs
    runs = CounterMetricFamily("jetlake_job_runs", "Finished runs of a maintenance job", labels=["job"])
    last = GaugeMetricFamily(
        "jetlake_job_last_run_timestamp_seconds", "When the job's newest run started", labels=["job"]
    )
    removed = CounterMetricFamily(
        "jetlake_job_rows_removed", "Message rows the job removed from storage", labels=["job"]
    )
    took = GaugeMetricFamily(
        "jetlake_job_last_run_duration_seconds", "How long the job's newest run took", labels=["job"]
    )
    failures = CounterMetricFamily(
        "jetlake_job_failures", "Runs of a maintenance job that ended with an error", labels=["job"]
    )
    failed = GaugeMetricFamily(
        "jetlake_job_last_run_failed", "1 when the job's newest run ended with an error", labels=["job"]
    )
    for job, f in sorted(jobs.items()):
        runs.add_metric([job], f.runs)
        last.add_metric([job], f.last.started / 1e9)
        removed.add_metric([job], f.rows_removed)
        took.add_metric([job], f.last.seconds)
        failures.add_metric([job], f.failures)
        failed.add_metric([job], 1 if f.last.error else 0)
    yield from (runs, last, removed, took, failures, failed)


# (metric, help, how to read it from a stream's lake figures)
LAKE_STREAM_GAUGES = (
    ("jetlake_lake_stream_files", "Live data files of the stream in the messages table", "files"),
    ("jetlake_lake_stream_bytes", "Bytes of the stream's live data files", "bytes"),
    (
        "jetlake_lake_stream_compaction_pending_files",
        "Small files of the stream the compaction's plan would merge",
        "compaction_pending_files",
    ),
    (
        "jetlake_lake_stream_active_block_files",
        "Files of the stream's highest block, where new commits land",
        "active_block_files",
    ),
    (
        "jetlake_lake_stream_unsealed_full_blocks",
        "Full blocks of the stream still made of several files (the seal job's work)",
        "unsealed_full_blocks",
    ),
)


def _lake_families(lake: LakeReport) -> Iterator[Metric]:
    """The tables' side, as the monitor last read it (every few seconds at most)."""
    yield _gauge("jetlake_lake_table_version", "Delta version of the messages table", lake.version)
    for name, doc, attr in LAKE_STREAM_GAUGES:
        fam = GaugeMetricFamily(name, doc, labels=["stream"])
        for s in lake.streams:
            fam.add_metric([s.name], float(getattr(s.files, attr)))
        yield fam
    reclaim = GaugeMetricFamily(
        "jetlake_lake_stream_unreclaimed_bytes",
        "Estimated bytes of removed messages the stream's files still hold (the retention job's work)",
        labels=["stream"],
    )
    age = GaugeMetricFamily(
        "jetlake_index_snapshot_age_seconds", "Age of the stream's index snapshot", labels=["stream"]
    )
    behind = GaugeMetricFamily(
        "jetlake_index_snapshot_behind_messages",
        "Committed messages beyond the stream's index snapshot (a restart after a crash reads them)",
        labels=["stream"],
    )
    now = lake.read_ns
    for s in lake.streams:
        reclaim.add_metric([s.name], float(s.unreclaimed_bytes))
        if s.snapshot_written_ns is not None:
            age.add_metric([s.name], max(0.0, (now - s.snapshot_written_ns) / 1e9))
        behind.add_metric([s.name], float(s.snapshot_behind))
    yield from (reclaim, age, behind)
    yield _counter("jetlake_compaction_rounds", "Compaction rounds the gateway ran", lake.compaction_rounds)
    yield _counter(
        "jetlake_compaction_failed_rounds", "Compaction rounds that failed", lake.compaction_failed_rounds
    )
    yield _counter(
        "jetlake_compaction_files_merged", "Files compaction merged away", lake.compaction_files_merged
    )
    yield _gauge("jetlake_lake_warnings", "Warnings the monitor's lake view shows", len(lake.warnings))


def _rate_families(c: Counters) -> Iterator[Metric]:
    """The counters whose rates the dashboards draw: ingest per stream, deliveries per consumer."""
    stored = CounterMetricFamily(
        "jetlake_stream_stored_messages",
        "Messages of the stream made durable (mirrored and sourced copies included)",
        labels=["stream"],
    )
    for name, n in sorted(c.stored.items()):
        stored.add_metric([name], n)
    delivered = CounterMetricFamily(
        "jetlake_consumer_deliveries",
        "Messages delivered by the consumer, redeliveries included (its consumer sequence)",
        labels=["stream", "consumer"],
    )
    for (stream, consumer), n in sorted(c.deliveries.items()):
        delivered.add_metric([stream, consumer], n)
    yield from (stored, delivered)


def families(snap: Snapshot, c: Counters, lake: LakeReport) -> Iterator[Metric]:
    api = snap.account.get("api") or {"total": 0, "errors": 0}
    yield _counter("jetlake_publish_received", "Publishes to a stream subject", c.publishes)
    yield _counter("jetlake_publish_errors", "Publishes answered with an error", c.publish_errors)
    yield _counter("jetlake_commits", "Delta commits of the messages table", c.commits)
    yield _counter("jetlake_messages_committed", "Messages made durable", c.messages_committed)
    yield _counter(
        "jetlake_messages_refused", "Messages turned away: too many bytes waiting for a commit", c.refused
    )
    yield _histogram("jetlake_commit_seconds", "Time of one group commit", c.commit_seconds)
    yield _histogram("jetlake_commit_batch_messages", "Messages per group commit", c.batch_messages)
    yield _histogram(
        "jetlake_puback_seconds",
        "From the leaf-link read that brought a publish to its PubAck leaving",
        c.puback_seconds,
    )
    yield _counter("jetlake_acklog_commits", "Delta commits of the consumer ack log", c.acklog_commits)
    yield _counter("jetlake_acklog_rows_committed", "Ack log rows made durable", c.acklog_rows)
    yield _counter("jetlake_acklog_compactions", "Ack log compactions", c.acklog_compactions)
    yield _gauge("jetlake_storage_bytes", "Bytes stored over all streams", snap.bytes)
    yield _gauge("jetlake_streams", "Streams", len(snap.streams))
    yield _gauge("jetlake_consumers", "Consumers", snap.consumer_count)
    yield _counter("jetlake_api_requests", "JetStream API requests answered", api["total"])
    yield _counter("jetlake_api_errors", "JetStream API requests answered with an error", api["errors"])
    yield _counter("jetlake_api_dropped", "API requests dropped on a full queue", c.api_dropped)
    yield _gauge("jetlake_leaf_connected", "1 while the leaf link to nats-server is up", c.leaf_connected)
    yield _counter("jetlake_leaf_reconnects", "Leaf link reconnects", c.leaf_reconnects)
    yield _counter(
        "jetlake_leaf_dropped_writes", "Frames dropped while the link was down", c.leaf_dropped_writes
    )
    yield from _stream_families(snap)
    yield from _consumer_families(snap)
    yield from _rate_families(c)
    yield from _job_families(lake)
    yield from _lake_families(lake)


class _Collector:
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def render(snap: Snapshot, counters: Counters, lake: LakeReport) -> bytes:
    """Prometheus text exposition (format 0.0.4) of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families(snap, counters, lake)))
    return generate_latest(registry)
