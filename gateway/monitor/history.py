"""The last minutes of a gateway, kept by the gateway: ingest and delivery rates and bytes held per
stream, lag and ack-pending per consumer, PubAck latency percentiles, one sample a second in bounded
ring buffers.

An operator asks "is ingest keeping up, which consumer is falling behind and since when, is storage
growing": numbers at one moment (``/jsz``, ``/metrics``) do not say it, and Prometheus may not be
there. The sampler only reads counters the components keep (the publish path's messages stored per
stream and its PubAck latency histogram, each stream's bytes, each consumer's delivered consumer
sequence, pending set and ack floor), on the event loop, in O(streams + consumers) a second; rates
are the differences of two readings. It writes only what moved: a series at rest holds its value
until it changes or an answer reads it (thousands of idle streams cost a comparison each, #23).
Each series holds at most ``capacity`` points, and a series goes with its stream or consumer, so
memory is bounded by what exists (about 5 KB a series); an answer holds the ``top`` series of each
metric that stand highest now (at most 100), so its size does not grow with the streams; its time
does, as every series is ranked (0.12 to 0.28 s of the loop at 10,000 streams on a loaded machine,
bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.service.gateway import Core

INTERVAL_S = 1.0
CAPACITY = 600  # ten minutes at one sample a second
QUANTILES = (0.5, 0.9, 0.99)

#: (metric, unit, what its points are) as the JSON and the dashboard name them
METRICS = {
    "ingest": ("msg/s", "messages made durable per second, per stream"),
    "delivery": ("msg/s", "messages delivered per second (redeliveries included), per stream"),
    "lag": ("messages", "stream last sequence minus the consumer's ack floor"),
    "ack_pending": ("messages", "messages delivered and awaiting an ack"),
    "bytes": ("bytes", "bytes the stream holds, as JetStream counts them (its storage growing or not)"),
    "puback_seconds": ("s", "PubAck latency percentiles over the sample's second (no PubAck: no point)"),
}

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)  # not frozen: a frozen one is four times as dear to make, 10,000 a second
class ConsumerReading:
    stream: str
    consumer: str
    delivered: int  # consumer sequence of the last delivery: deliveries so far
    ack_pending: int
    lag: int


@dataclass(frozen=True, slots=True)
class Reading:
    """The counters at one moment."""

    mono: float  # time.monotonic(), for the rates
    wall: float  # Unix seconds, for the charts
    stored: dict[str, int]  # stream -> messages made durable
    bytes: dict[str, int]  # stream -> bytes it holds
    consumers: list[ConsumerReading]
    puback_counts: list[int]  # the PubAck histogram's bucket counts (not cumulative)
    puback_bounds: tuple[float, ...]


def read(core: Core, mono: float, wall: float) -> Reading:
    """The counters of a running gateway (on the event loop: the state is the loop's)."""
    reg, publish = core.registry, core.publish
    consumers = [
        ConsumerReading(
            stream.name,
            c.name,
            c.dseq,
            len(c.pending),
            max(0, stream.state.last_seq - c.ack_floor_sseq),
        )
        for stream in reg.streams.values()
        for c in reg.consumers.get(stream.name, {}).values()
    ]
    stored = {name: publish.stored.get(name, 0) for name in reg.streams}
    held = {name: stream.state.bytes for name, stream in reg.streams.items()}
    hist = publish.puback_seconds
    return Reading(mono, wall, stored, held, consumers, list(hist.counts), hist.bounds)


def quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float | None:
    """The ``q`` quantile of observations counted into buckets (upper ``bounds``, +Inf last), as
    Prometheus's ``histogram_quantile`` estimates it: linear within the bucket it falls in, the
    highest finite bound if it falls in +Inf. None without observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if below + n >= rank and n:
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / n
        below += n
    return bounds[-1]


@dataclass(slots=True)
class _Series:
    """A series' ring of ``capacity`` doubles (NaN: no value at that sample), written up to sample
    ``filled`` (exclusive); every later sample holds ``held``, written in when the value changes or
    an answer reads the series."""

    values: array[float]
    held: float
    filled: int


class History:
    """Ring buffers on one time axis: the sample times in one deque, each series' values in a fixed
    array of ``capacity`` doubles (NaN: no value at that sample), written at the slot of the sample.
    About 5 KB a series at the default capacity, whatever happens."""

    def __init__(self, capacity: int = CAPACITY, interval_s: float = INTERVAL_S) -> None:
        self.capacity = capacity
        self.interval_s = interval_s
        self._times: deque[float] = deque(maxlen=capacity)  # Unix s of the last samples
        self._samples = 0  # samples taken so far: the next one's slot is this modulo capacity
        self._series: dict[SeriesKey, _Series] = {}
        self._last: Reading | None = None
        self._pairs: dict[tuple[str, str], ConsumerReading] = {}  # the last reading's consumers
        #: streams whose last values put were no ingest, no delivery: unmoved, nothing to write
        self._resting: set[str] = set()

    def add(self, now: Reading) -> None:
        """One sample: rates against the previous reading, levels as they are. A counter that went
        down (its stream or consumer was made anew) gives no rate this time. A stream or consumer
        whose counters did not move since a sample that already put it at rest (no rate, the same
        levels) is passed over: its series hold their value (:class:`_Series`), so the loop's work
        a second is what moved, not what exists (#23: thousands of idle KV buckets)."""
        before, self._last = self._last, now
        sample = self._samples
        dt = now.mono - before.mono if before is not None else 0.0
        was, self._pairs = self._pairs, {(c.stream, c.consumer): c for c in now.consumers}
        delivered: dict[str, int] = {}
        for c in now.consumers:
            prior = was.get((c.stream, c.consumer))
            if prior is not None and (c.delivered, c.lag, c.ack_pending) == (
                prior.delivered,
                prior.lag,
                prior.ack_pending,
            ):
                continue  # at rest: lag and ack_pending hold, nothing delivered
            pair = (("stream", c.stream), ("consumer", c.consumer))
            self._put(("lag", pair), c.lag, sample)
            self._put(("ack_pending", pair), c.ack_pending, sample)
            if prior is not None and c.delivered >= prior.delivered and c.stream in now.stored:
                delivered[c.stream] = delivered.get(c.stream, 0) + c.delivered - prior.delivered
        was_stored = before.stored if before is not None else {}
        was_bytes = before.bytes if before is not None else {}
        for name, stored in now.stored.items():
            count = was_stored.get(name)
            held = now.bytes.get(name)
            moved = delivered.get(name, 0)
            at_rest = count == stored and was_bytes.get(name) == held and not moved and dt > 0
            if at_rest and name in self._resting:
                continue  # ingest and delivery stay 0, bytes as they were
            labels = (("stream", name),)
            rate = (stored - count) / dt if count is not None and stored >= count and dt > 0 else None
            rate_out = moved / dt if before is not None and dt > 0 else None
            self._put(("ingest", labels), rate, sample)
            self._put(("delivery", labels), rate_out, sample)
            self._put(("bytes", labels), held, sample)
            if rate == 0 and rate_out == 0:
                self._resting.add(name)
            else:
                self._resting.discard(name)
        puback: list[SeriesKey] = [("puback_seconds", (("quantile", str(q)),)) for q in QUANTILES]
        if before is not None and before.puback_bounds == now.puback_bounds:
            window = [a - b for a, b in zip(now.puback_counts, before.puback_counts, strict=True)]
            for q, key in zip(QUANTILES, puback, strict=True):
                self._put(key, quantile(q, now.puback_bounds, window), sample)
        else:
            self._drop(puback)
        self._drop_gone(before, now, was)
        self._times.append(round(now.wall, 3))
        self._samples += 1

    def _put(self, key: SeriesKey, value: float | None, sample: int) -> None:
        """``value`` (None: no value) at ``sample``; a series starts at its first value."""
        series = self._series.get(key)
        if series is None:
            if value is None:
                return
            series = self._series[key] = _Series(array("d", [math.nan]) * self.capacity, math.nan, sample)
        v = math.nan if value is None else float(value)
        if v == series.held or (math.isnan(v) and math.isnan(series.held)):
            return
        self._fill(series, sample)
        series.values[sample % self.capacity] = series.held = v
        series.filled = sample + 1

    def _fill(self, series: _Series, upto: int) -> None:
        """Write the value a series holds into the slots of its samples before ``upto``."""
        start = max(series.filled, upto - self.capacity)
        if start < upto:
            slots = np.arange(start, upto) % self.capacity
            np.frombuffer(series.values, dtype=np.float64)[slots] = series.held
        series.filled = upto

    def _drop(self, keys: Sequence[SeriesKey]) -> None:
        for key in keys:
            self._series.pop(key, None)

    def _drop_gone(
        self, before: Reading | None, now: Reading, was: dict[tuple[str, str], ConsumerReading]
    ) -> None:
        """The series of streams and consumers in the previous reading (``was``: its consumers)
        and not in this one."""
        if before is None:
            return
        for name in before.stored.keys() - now.stored.keys():
            self._resting.discard(name)
            labels = (("stream", name),)
            self._drop([("ingest", labels), ("delivery", labels), ("bytes", labels)])
        for stream, consumer in was.keys() - self._pairs.keys():
            pair = (("stream", stream), ("consumer", consumer))
            self._drop([("lag", pair), ("ack_pending", pair)])

    def _points(self, values: array[float], times: np.ndarray, order: np.ndarray) -> list[list[float]]:
        """A series' points ``[unix s, value]``, oldest first, the samples without a value left out
        (``times`` and ``order``: the kept samples' times and slots, oldest first)."""
        v = np.frombuffer(values, dtype=np.float64)[order]
        kept = ~np.isnan(v)
        return [list(p) for p in zip(times[kept].tolist(), v[kept].round(6).tolist(), strict=True)]

    def render(self, top: int | None = None) -> dict[str, Any]:
        """The JSON of ``/history``: the series with their points, oldest first; with ``top``, per
        metric only the ``top`` series of the highest latest values (a page draws a few lines, not
        one per stream of thousands), chosen before any point is read."""
        by_metric: dict[str, list[tuple[SeriesKey, _Series]]] = {}
        for key, held in sorted(self._series.items()):
            by_metric.setdefault(key[0], []).append((key, held))
        if top is not None and self._samples:

            def latest(item: tuple[SeriesKey, _Series]) -> float:
                v = item[1].held  # the value of the latest sample
                return -math.inf if math.isnan(v) else v

            for metric, items in by_metric.items():
                chosen = {id(item) for item in sorted(items, key=latest, reverse=True)[:top]}
                by_metric[metric] = [item for item in items if id(item) in chosen]
        times = np.array(self._times, dtype=np.float64)
        first = self._samples - len(self._times)  # the oldest sample kept
        order = (first + np.arange(len(times))) % self.capacity
        series = []
        for items in by_metric.values():
            for (metric, labels), held in items:
                self._fill(held, self._samples)
                points = self._points(held.values, times, order)
                if points:
                    series.append({"metric": metric, "labels": dict(labels), "points": points})
        return {
            "interval_s": self.interval_s,
            "capacity": self.capacity,
            "metrics": {m: {"unit": u, "help": h} for m, (u, h) in METRICS.items()},
            "series": series,
        }

    async def run(self, core: Callable[[], Core | None]) -> None:
        """The sampler task: a reading every ``interval_s`` while the gateway runs."""
        while True:
            started = core()
            if started is not None:
                self.add(read(started, time.monotonic(), time.time()))
            await asyncio.sleep(self.interval_s)
