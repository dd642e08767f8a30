"""STREAM.UPDATE rules: which changes of a stream's config JetStream allows, and what sealing implies.

Pure: takes the stream's current config and the normalized requested one, returns the config to
store or raises the real server's error (descriptions read from nats-server's ``server/stream.go``
and pinned by differential tests).
"""

from __future__ import annotations

from typing import Any

from gateway.api import errors


def _invalid(text: str) -> errors.ApiError:
    return errors.STREAM_INVALID_CONFIG.format(err=f"stream configuration update can not {text}")


#: Flags an update may turn on but not off, with the server's words for turning them off.
_ONE_WAY = (
    ("sealed", "stream configuration update can not unseal a sealed stream"),
    ("deny_delete", "stream configuration update can not cancel deny message deletes"),
    ("deny_purge", "stream configuration update can not cancel deny purge"),
    ("allow_msg_ttl", "message TTL status can not be disabled"),
)


def apply_update(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The config an update leaves the stream with, or the error JetStream answers (the checks in
    the server's order)."""
    if int(new.get("num_replicas") or 1) > 1:
        raise errors.STREAM_REPLICAS_NOT_SUPPORTED
    if new.get("storage") != old.get("storage"):
        raise _invalid("change storage type")
    if new.get("retention") != old.get("retention") and "workqueue" in (
        new.get("retention"),
        old.get("retention"),
    ):
        raise _invalid("change retention policy to/from workqueue")
    for flag, words in _ONE_WAY:
        if old.get(flag) and not new.get(flag):
            raise errors.STREAM_INVALID_CONFIG.format(err=words)
    if old.get("persist_mode") != new.get("persist_mode"):
        raise _invalid("change persist mode")
    out = dict(new)
    if out.get("sealed"):
        # A sealed stream takes no more messages and loses none.
        out.update({"max_age": 0, "discard": "new", "deny_delete": True, "deny_purge": True})
        out["allow_rollup_hdrs"] = False
    return out
