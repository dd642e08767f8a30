"""StreamConfig as JetStream has it: defaults filled in, validated, rendered back.

A config is kept as the dict the API returns (JetStream's field names and defaults), because the
API must hand back exactly what the real server would: clients read it and send it back on update.
"""

from __future__ import annotations

from typing import Any

from gateway import errors
from gateway.subjects import is_valid_subject

DEFAULT_DUPLICATE_WINDOW_NS = 120_000_000_000

STREAM_DEFAULTS: dict[str, Any] = {
    "retention": "limits",
    "max_consumers": -1,
    "max_msgs": -1,
    "max_bytes": -1,
    "max_age": 0,
    "max_msgs_per_subject": -1,
    "max_msg_size": -1,
    "discard": "old",
    "storage": "file",
    "num_replicas": 1,
    "duplicate_window": DEFAULT_DUPLICATE_WINDOW_NS,
    "compression": "none",
    "allow_direct": False,
    "mirror_direct": False,
    "sealed": False,
    "deny_delete": False,
    "deny_purge": False,
    "allow_rollup_hdrs": False,
    "consumer_limits": {},
    "allow_msg_ttl": False,
}

#: Fields that are rendered only when set, as the real server omits them at their zero value.
OPTIONAL_FIELDS = (
    "description",
    "no_ack",
    "discard_new_per_subject",
    "subject_delete_marker_ttl",
    "first_seq",
    "placement",
    "republish",
    "subject_transform",
)


def valid_stream_name(name: str) -> bool:
    return bool(name) and not any(c in name for c in ".*> \t\r\n/\\") and len(name) <= 255


def normalize(raw: dict[str, Any], server_version: str) -> dict[str, Any]:
    """The config a create request asks for, with JetStream's defaults and the server metadata."""
    name = raw.get("name") or ""
    if not valid_stream_name(name):
        raise errors.STREAM_INVALID_CONFIG.format(
            err="stream name is required and can not contain '.', '*', '>'"
        )
    subjects = raw.get("subjects") or [name]
    if not isinstance(subjects, list) or not all(isinstance(s, str) for s in subjects):
        raise errors.STREAM_INVALID_CONFIG.format(err="invalid subjects")
    for subject in subjects:
        if not is_valid_subject(subject):
            raise errors.STREAM_INVALID_CONFIG.format(err=f"invalid subject: {subject}")
    cfg: dict[str, Any] = {"name": name}
    if raw.get("description"):
        cfg["description"] = raw["description"]
    cfg["subjects"] = subjects
    for key, default in STREAM_DEFAULTS.items():
        value = raw.get(key)
        cfg[key] = (
            default
            if value in (None, 0) and key in ("duplicate_window",)
            else (default if value is None else value)
        )
    if cfg["max_consumers"] == 0:
        cfg["max_consumers"] = -1
    for key in ("max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size"):
        if cfg[key] == 0:
            cfg[key] = -1
    for key in OPTIONAL_FIELDS:
        if raw.get(key):
            cfg[key] = raw[key]
    metadata = {k: v for k, v in (raw.get("metadata") or {}).items() if not k.startswith("_nats.")}
    metadata.update({"_nats.level": "5", "_nats.req.level": "0", "_nats.ver": server_version})
    cfg["metadata"] = metadata
    return cfg


def same_config(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two normalized configs are equal, ignoring the server-owned metadata."""
    strip = {"metadata"}
    return {k: v for k, v in a.items() if k not in strip} == {k: v for k, v in b.items() if k not in strip}
