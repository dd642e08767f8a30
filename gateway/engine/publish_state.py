"""Rebuilding what the publish path keeps per stream from the stored header blocks, at start-up:
the ``Nats-Msg-Id`` window and last msg id, the ``Nats-TTL`` schedule, and rollups.

Rollups are replayed because they are removals the removal log may not have received before a
crash: a rollup message purges its subject (or stream) again, which is what it did when it was
stored, so the view after a restart is the view before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress

from gateway.api.configs import StreamConfig
from gateway.engine.msg_ttl import InvalidTTL, parse_ttl
from gateway.engine.publish_checks import is_delete_marker
from gateway.engine.stream import Stream
from storage_delta.format.nats import parse_headers


def needs_full_scan(config: StreamConfig) -> bool:
    """TTLs and rollups can concern any stored message; otherwise only the duplicate window."""
    return config.allow_msg_ttl or config.allow_rollup_hdrs


def headers_since(config: StreamConfig, created_ns: int, now_ns: int) -> int:
    """From which stored time on the header blocks matter: all of the stream's messages when TTLs or
    rollups can concern any of them, else those within the duplicate window."""
    if needs_full_scan(config):
        return created_ns
    return max(created_ns, now_ns - config.duplicate_window)


def replay_headers(
    stream: Stream, rows: Iterable[tuple[int, int, bytes | None]], now_ns: int, dedup: bool = True
) -> None:
    """Feed the (seq, stored time, header block) of the stream's stored messages that have a header
    block, in sequence order (a message without one changes nothing here but the last msg id, which
    then is empty: the check at the end gives the same). Without ``dedup`` the duplicate window is
    left empty: a restored stream's is, on the server too, until it is loaded again."""
    window = stream.config.duplicate_window
    since = now_ns - window
    last_id, last_seq = "", 0
    for seq, ts, hdrs in rows:
        if not stream.is_live(seq):  # nats-server can no longer load a removed message either
            continue
        h = parse_headers(hdrs) if hdrs else {}
        if dedup and ts >= since:  # as nats-server, which rebuilds both from the window's messages only
            last_id, last_seq = h.get("Nats-Msg-Id", ""), seq
            stream.dedup.record(last_id, seq, ts, now_ns, window)
        ttl = h.get("Nats-TTL")
        if ttl:
            with suppress(InvalidTTL):  # cannot be stored: refused at publish
                stream.ttl.add(seq, ts, parse_ttl(ttl))
        if is_delete_marker(h):
            stream.ttl.markers.add(seq)
        rollup = h.get("Nats-Rollup", "").lower()
        if rollup in ("sub", "all"):
            stream.purge(subject=stream.subject_of(seq) if rollup == "sub" else None, seq=seq)
    # Only the newest message's id counts for Nats-Expected-Last-Msg-Id.
    stream.dedup.last_msg_id = last_id if last_seq == stream.last_seq else ""
