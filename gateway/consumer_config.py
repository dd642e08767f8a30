"""ConsumerConfig as JetStream has it: defaults filled in, rendered back as the real server does."""

from __future__ import annotations

from typing import Any

from gateway import errors
from gateway.subjects import is_valid_subject

DEFAULT_ACK_WAIT_NS = 30_000_000_000
DEFAULT_MAX_WAITING = 512
DEFAULT_MAX_ACK_PENDING = 1000


def normalize(raw: dict[str, Any], server_version: str) -> dict[str, Any]:
    """The config a create request asks for, with JetStream's defaults (a raw request without
    ``ack_policy`` gets ``none``, the JSON zero value, as the real server does)."""
    cfg: dict[str, Any] = {}
    durable = raw.get("durable_name") or ""
    name = raw.get("name") or durable
    if durable:
        cfg["durable_name"] = durable
    if name:
        cfg["name"] = name
    if raw.get("description"):
        cfg["description"] = raw["description"]
    cfg["deliver_policy"] = raw.get("deliver_policy") or "all"
    ack_policy = raw.get("ack_policy") or "none"
    cfg["ack_policy"] = ack_policy
    cfg["ack_wait"] = raw.get("ack_wait") or DEFAULT_ACK_WAIT_NS
    cfg["max_deliver"] = raw.get("max_deliver") or -1
    filters = raw.get("filter_subjects") or []
    if raw.get("filter_subject"):
        if not is_valid_subject(raw["filter_subject"]):
            raise errors.CONSUMER_CREATE.format(err="consumer filter subject is not a valid subset")
        cfg["filter_subject"] = raw["filter_subject"]
    if filters:
        cfg["filter_subjects"] = filters
    cfg["replay_policy"] = raw.get("replay_policy") or "instant"
    if raw.get("deliver_subject"):
        cfg["deliver_subject"] = raw["deliver_subject"]
    else:
        cfg["max_waiting"] = raw.get("max_waiting") or DEFAULT_MAX_WAITING
    if ack_policy != "none":
        cfg["max_ack_pending"] = raw.get("max_ack_pending") or DEFAULT_MAX_ACK_PENDING
    for key in (
        "max_batch",
        "max_expires",
        "max_bytes",
        "inactive_threshold",
        "headers_only",
        "sample_freq",
        "rate_limit_bps",
        "backoff",
        "idle_heartbeat",
        "flow_control",
        "deliver_group",
        "opt_start_seq",
        "opt_start_time",
    ):
        if raw.get(key):
            cfg[key] = raw[key]
    cfg["num_replicas"] = raw.get("num_replicas") or 0
    metadata = {k: v for k, v in (raw.get("metadata") or {}).items() if not k.startswith("_nats.")}
    metadata.update({"_nats.level": "5", "_nats.req.level": "0", "_nats.ver": server_version})
    cfg["metadata"] = metadata
    return cfg


def filters_of(cfg: dict[str, Any]) -> list[str]:
    if cfg.get("filter_subject"):
        return [cfg["filter_subject"]]
    return list(cfg.get("filter_subjects") or [])
