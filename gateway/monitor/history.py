"""The last minutes of a gateway, kept by the gateway: ingest and delivery rates and bytes held per
stream, lag and ack-pending per consumer, PubAck latency percentiles, one sample a second in bounded
ring buffers.

An operator asks "is ingest keeping up, which consumer is falling behind and since when, is storage
growing": numbers at one moment (``/jsz``, ``/metrics``) do not say it, and Prometheus may not be
there. The sampler only reads counters the components keep (the publish path's messages stored per
stream and its PubAck latency histogram, each stream's bytes, each consumer's delivered consumer
sequence, pending set and ack floor), on the event loop, in O(streams + consumers) a second; rates
are the differences of two readings. Each series holds at most ``capacity`` points, and a series
goes with its stream or consumer, so memory is bounded by what exists (about 5 KB a series); an
answer holds the ``top`` series of each metric that stand highest now (at most 100), so it costs
the loop tens of milliseconds however many streams there are.
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


@dataclass(frozen=True, slots=True)
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


class History:
    """Ring buffers on one time axis: the sample times in one deque, each series' values in a fixed
    array of ``capacity`` doubles (NaN: no value at that sample), written at the slot of the sample.
    About 5 KB a series at the default capacity, whatever happens."""

    def __init__(self, capacity: int = CAPACITY, interval_s: float = INTERVAL_S) -> None:
        self.capacity = capacity
        self.interval_s = interval_s
        self._times: deque[float] = deque(maxlen=capacity)  # Unix s of the last samples
        self._samples = 0  # samples taken so far: the next one's slot is this modulo capacity
        self._series: dict[SeriesKey, array[float]] = {}
        self._last: Reading | None = None

    def add(self, now: Reading) -> None:
        """One sample: rates against the previous reading, levels as they are. A counter that went
        down (its stream or consumer was made anew) gives no rate this time."""
        before, self._last = self._last, now
        slot = self._samples % self.capacity
        live: set[SeriesKey] = set()

        def put(metric: str, labels: tuple[tuple[str, str], ...], value: float | None) -> None:
            key = (metric, labels)
            live.add(key)
            values = self._series.get(key)
            if values is None:
                if value is None:
                    return
                values = self._series[key] = array("d", [math.nan]) * self.capacity
            values[slot] = math.nan if value is None else value

        dt = now.mono - before.mono if before is not None else 0.0
        delivered: dict[str, int] = dict.fromkeys(now.stored, 0)
        was = {(c.stream, c.consumer): c.delivered for c in before.consumers} if before else {}
        for c in now.consumers:
            pair = (("stream", c.stream), ("consumer", c.consumer))
            put("lag", pair, c.lag)
            put("ack_pending", pair, c.ack_pending)
            prior = was.get((c.stream, c.consumer))
            if prior is not None and c.delivered >= prior and c.stream in delivered:
                delivered[c.stream] += c.delivered - prior
        for name, stored in now.stored.items():
            labels = (("stream", name),)
            prior = before.stored.get(name) if before else None
            rate = (stored - prior) / dt if prior is not None and stored >= prior and dt > 0 else None
            put("ingest", labels, rate)
            put("delivery", labels, delivered[name] / dt if before is not None and dt > 0 else None)
            put("bytes", labels, now.bytes.get(name))
        if before is not None and before.puback_bounds == now.puback_bounds:
            window = [a - b for a, b in zip(now.puback_counts, before.puback_counts, strict=True)]
            for q in QUANTILES:
                put("puback_seconds", (("quantile", str(q)),), quantile(q, now.puback_bounds, window))
        for key in [k for k in self._series if k not in live]:  # its stream or consumer is gone
            del self._series[key]
        self._times.append(round(now.wall, 3))
        self._samples += 1

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
        by_metric: dict[str, list[tuple[SeriesKey, array[float]]]] = {}
        for key, values in sorted(self._series.items()):
            by_metric.setdefault(key[0], []).append((key, values))
        if top is not None and self._samples:
            slot = (self._samples - 1) % self.capacity

            def latest(item: tuple[SeriesKey, array[float]]) -> float:
                v = item[1][slot]
                return -math.inf if math.isnan(v) else v

            for metric, items in by_metric.items():
                chosen = {id(item) for item in sorted(items, key=latest, reverse=True)[:top]}
                by_metric[metric] = [item for item in items if id(item) in chosen]
        times = np.array(self._times, dtype=np.float64)
        first = self._samples - len(self._times)  # the oldest sample kept
        order = (first + np.arange(len(times))) % self.capacity
        series = []
        for items in by_metric.values():
            for (metric, labels), values in items:
                points = self._points(values, times, order)
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
