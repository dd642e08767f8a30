"""``/jsz``: streams and consumers with their state, in the shape of nats-server's ``/jsz``.

Every number comes from the same answers the JetStream API gives (``INFO``, ``STREAM.INFO``,
``CONSUMER.INFO`` through the gateway's router, in process), so the monitor can never disagree with
what clients see. Field names follow nats-server 2.15's monitor output for
``/jsz?streams=true&consumers=true&config=true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.api.advisories import ACCOUNT
from gateway.api.timefmt import now_ns, rfc3339
from gateway.handlers.router import Api

# Metadata the API adds to every config it answers with, which nats-server's /jsz does not show
# (it shows the config as stored).
API_ONLY_METADATA = ("_nats.level", "_nats.ver")


def stored_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config as /jsz shows it: without the metadata the API adds to its answers."""
    meta = config.get("metadata")
    if not isinstance(meta, dict):
        return config
    return {**config, "metadata": {k: v for k, v in meta.items() if k not in API_ONLY_METADATA}}


@dataclass(frozen=True, slots=True)
class StreamView:
    """One stream's ``STREAM.INFO`` answer and the ``CONSUMER.INFO`` answers of its consumers."""

    info: dict[str, Any]
    consumers: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return str(self.info["config"]["name"])

    @property
    def last_seq(self) -> int:
        return int(self.info["state"]["last_seq"])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the monitor shows at one moment, taken on the event loop between two API requests."""

    account: dict[str, Any]
    streams: list[StreamView]
    now_ns: int

    @property
    def bytes(self) -> int:
        return sum(int(s.info["state"]["bytes"]) for s in self.streams)

    @property
    def messages(self) -> int:
        return sum(int(s.info["state"]["messages"]) for s in self.streams)

    @property
    def consumer_count(self) -> int:
        return sum(len(s.consumers) for s in self.streams)


async def _ask(api: Api, toks: list[str]) -> dict[str, Any] | None:
    """The API's JSON answer, or None for an error (e.g. a stream deleted meanwhile)."""
    answer = await api.handle(toks, b"")
    return answer if isinstance(answer, dict) and "error" not in answer else None


async def take_snapshot(api: Api, stream_names: list[str], consumer_names: dict[str, list[str]]) -> Snapshot:
    """Ask the API, in process, about every stream and consumer."""
    views: list[StreamView] = []
    for name in sorted(stream_names):
        info = await _ask(api, ["STREAM", "INFO", name])
        if info is None:
            continue
        consumers = [
            await _ask(api, ["CONSUMER", "INFO", name, c]) for c in sorted(consumer_names.get(name, []))
        ]
        views.append(StreamView(info, [c for c in consumers if c is not None]))
    return Snapshot(await _ask(api, ["INFO"]) or {}, views, now_ns())


@dataclass(frozen=True, slots=True)
class JszOptions:
    """The query of ``/jsz``, as nats-server reads it (``consumers`` implies ``streams``)."""

    accounts: bool = False
    streams: bool = False
    consumers: bool = False
    config: bool = False


def _consumer_detail(info: dict[str, Any], config: bool) -> dict[str, Any]:
    return {
        k: stored_config(v) if k == "config" else v
        for k, v in info.items()
        if k != "type" and (config or k != "config")
    }


def _stream_detail(view: StreamView, opts: JszOptions, leader: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": view.name,
        "created": view.info["created"],
        "cluster": {"leader": leader},
    }
    if opts.config:
        out["config"] = stored_config(view.info["config"])
    out["state"] = view.info["state"]
    if opts.consumers:
        out["consumer_detail"] = [_consumer_detail(c, opts.config) for c in view.consumers]
    return out


def render_jsz(
    snap: Snapshot, opts: JszOptions, server_id: str, store_dir: str, domain: str
) -> dict[str, Any]:
    api = snap.account.get("api") or {"level": 0, "total": 0, "errors": 0}
    usage = {  # as $JS.API.INFO counts them: memory streams apart
        "memory": int(snap.account.get("memory") or 0),
        "storage": int(snap.account.get("storage") or 0),
        "reserved_memory": 0,
        "reserved_storage": 0,
    }
    out: dict[str, Any] = {
        **usage,
        "accounts": 1,
        "ha_assets": 0,
        "api": api,
        "server_id": server_id,
        "now": rfc3339(snap.now_ns),
        "config": {"max_memory": 0, "max_storage": -1, "store_dir": store_dir, "domain": domain},
        "limits": {},
        "streams": len(snap.streams),
        "consumers": snap.consumer_count,
        "messages": snap.messages,
        "bytes": snap.bytes,
    }
    if opts.accounts or opts.streams or opts.consumers:
        detail: dict[str, Any] = {
            "name": ACCOUNT,
            "id": ACCOUNT,
            **usage,
            "accounts": 0,
            "ha_assets": 0,
            "api": {"level": 0, "total": api["total"], "errors": api["errors"]},
        }
        if opts.streams or opts.consumers:
            detail["stream_detail"] = [_stream_detail(v, opts, server_id) for v in snap.streams]
        out["account_details"] = [detail]
    out["total"] = 1
    return out
