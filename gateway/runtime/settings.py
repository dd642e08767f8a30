"""The gateway's settings: ``conf/jetlake.toml``, then ``JETLAKE_<KEY>`` variables, then the flags of
``jetlake serve``, through the one loader (``storage_delta/format/settings.py``).

One typed object per process, loaded once when ``jetlake serve`` starts (``LOADER.load``), never at
import time, and handed to what needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from storage_delta.commit.durable import sync_interval_seconds
from storage_delta.format.settings import Loader, SettingsError, setting

__all__ = ["LOADER", "Settings"]

MiB = 1024 * 1024


EVENT_LOOPS = ("uvloop", "asyncio")


@dataclass(frozen=True)
class Settings:
    """What one gateway process serves and how: each field's meaning is its flag's help and its row
    in the README's table, so it is written once, here."""

    data_root: str = setting(
        "./data", "where the Delta tables live: a directory, or an object-store URI such as `s3://…`"
    )
    sync_interval: str = setting(
        "always",
        "when writes reach stable storage (JetStream's `sync_interval`): `always` syncs every commit "
        "before its PubAck, ack reply or API answer; a duration (`2m`, `30s`) syncs that often instead, "
        "so a power cut can lose what was acknowledged since; no effect on an object store",
    )
    storage_options: dict[str, str] = setting(
        {},
        "object-store options for delta-rs (e.g. `AWS_ENDPOINT_URL`, `AWS_REGION`); "
        "put secrets in the variable, not the file",
    )
    nats_url: str = setting(
        "",
        "leafnode URL of an existing nats-server (`nats-leaf://user:password@host:7422`, `tls://…`); "
        "empty: start an embedded nats-server",
    )
    host: str = setting("127.0.0.1", "address the embedded nats-server's client and leafnode ports bind to")
    client_port: int = setting(4222, "the embedded nats-server's client port")
    leaf_port: int = setting(7422, "the embedded nats-server's leafnode port")
    domain: str = setting("jetlake", "JetStream domain the API is served under: `$JS.<domain>.API.>`")
    monitor_host: str = setting("127.0.0.1", "address of the HTTP monitor (see *Watching it*)")
    monitor_port: int = setting(8222, "port of the HTTP monitor; 0 turns it off")
    monitor_token: str = setting(
        "",
        "bearer token the monitor asks for on `/jsz`, `/metrics`, `/history` and `/lake` (empty: none); "
        "set it as the variable rather than in the file",
    )
    monitor_lake_refresh_ms: int = setting(
        5000,
        "the monitor reads the tables (files per stream, index snapshots, job runs) at most this often; "
        "answers in between show the last reading (0: every answer reads them)",
    )
    max_pending_bytes: int = setting(
        64 * MiB, "bytes of publishes that may wait for a Delta commit before publishers get an error"
    )
    tail_cache_bytes: int = setting(
        32 * MiB, "bytes of newest messages kept in memory per stream for consumers that keep up"
    )
    ack_flush_interval_ms: int = setting(
        100,
        "longest wait of a plain ack (or a delivery) for its ack log commit; "
        "an `ack_sync` commits at once and is answered after the commit",
    )
    acklog_max_pending: int = setting(
        100_000,
        "ack log rows that may wait for a commit; when full, acks are not taken "
        "(the message is redelivered after `ack_wait`) and deliveries wait",
    )
    acklog_compact_rows: int = setting(
        250_000,
        "compact the ack log (fold rows at or below each consumer's ack floor) after this many rows; "
        "0: never",
    )
    owner_lease_ms: int = setting(
        1000,
        "several gateways on one store root: how long a gateway's beat may stay unchanged before its "
        "streams (and, for the meta owner, the store lease) move to another "
        "(docs/architecture.md, *Several gateways on one store*)",
    )
    index_snapshot_interval_ms: int = setting(
        10_000,
        "how often the gateway looks for streams due an index snapshot "
        "(what a restart reads instead of every message file); every clean stop writes them too",
    )
    index_snapshot_min_new: int = setting(
        10_000,
        "messages committed since a stream's last index snapshot that make it due another "
        "(a restart after `kill -9` reads about this many beyond it)",
    )
    log_retention_ms: int = setting(
        3_600_000,
        "how long a table's Delta log keeps the entries and checkpoints of past versions (Delta's "
        "`delta.logRetentionDuration`): older ones below a checkpoint are deleted when the next checkpoint "
        "is written; a version within it stays loadable (time travel, a change feed's offsets), "
        "in `messages` only the last 10,000",
    )
    compact_min_files: int = setting(
        16,
        "the gateway merges a stream's recent commit files in the background once this many of about "
        "the same size lie side by side in a block (a full block's once it holds two); 0: off",
    )
    compact_max_file_bytes: int = setting(
        64 * MiB, "files this large are not merged by the gateway (the `seal` job merges whole blocks)"
    )
    compact_interval_ms: int = setting(
        1000,
        "shortest time between two compaction rounds, so that a round under steady load merges many files "
        "(a round that leaves a backlog is followed at once)",
    )
    compact_idle_ms: int = setting(
        10_000,
        "a stream without a new commit file for this long is idle: its active block's small files are "
        "merged further, so readers of a paused stream open about as few files as after large commits",
    )
    leaf_name: str = setting("jetlake", "name the gateway's leaf connection reports to the server")
    creds_file: str = setting(
        "", "NATS credentials file (user JWT + seed, as `nsc` writes it) for the leaf connection"
    )
    nkey_seed_file: str = setting(
        "", "file holding the nkey seed the leaf connection signs the server's nonce with"
    )
    tls_ca_file: str = setting(
        "", "CA file that verifies the hub's TLS certificate (empty: the system's CAs)"
    )
    tls_cert_file: str = setting("", "client certificate, for hubs that verify leaf certificates")
    tls_key_file: str = setting("", "the client certificate's key")
    event_loop: str = setting(
        "uvloop",
        "the gateway's asyncio event loop: `uvloop` (libuv's, installed with jetlake) or `asyncio` "
        "(the standard library's)",
    )

    def __post_init__(self) -> None:
        try:
            sync_interval_seconds(self.sync_interval)
        except ValueError as exc:
            raise SettingsError(f"sync_interval: {exc}") from None
        if self.event_loop not in EVENT_LOOPS:
            raise SettingsError(f"event_loop: {self.event_loop!r} is not one of {', '.join(EVENT_LOOPS)}")

    @property
    def sync_seconds(self) -> float | None:
        """``sync_interval`` in seconds; None for ``always``."""
        return sync_interval_seconds(self.sync_interval)

    @property
    def embedded(self) -> bool:
        return not self.nats_url


LOADER = Loader(Settings, Path(__file__).resolve().parents[2] / "conf" / "jetlake.toml", "JETLAKE_")
