"""STREAM.UPDATE rules: which changes of a stream's config JetStream allows, and what sealing implies.

Pure: takes the stream's current config and the normalized requested one, returns the config to
store or raises the real server's error (descriptions read from nats-server's ``server/stream.go``
and pinned by differential tests).
"""

from __future__ import annotations

from typing import Any

from gateway import errors


def _invalid(text: str) -> errors.ApiError:
    return errors.STREAM_INVALID_CONFIG.format(err=f"stream configuration update can not {text}")


def apply_update(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The config an update leaves the stream with, or the error JetStream answers."""
    if old.get("sealed") and not new.get("sealed"):
        raise _invalid("unseal a sealed stream")
    if new.get("storage") != old.get("storage"):
        raise _invalid("change storage type")
    if new.get("retention") != old.get("retention") and "workqueue" in (
        new.get("retention"),
        old.get("retention"),
    ):
        raise _invalid("change retention policy to/from workqueue")
    if int(new.get("num_replicas") or 1) > 1:
        raise errors.STREAM_REPLICAS_NOT_SUPPORTED
    out = dict(new)
    if out.get("sealed"):
        # A sealed stream takes no more messages and loses none.
        out.update({"discard": "new", "deny_delete": True, "deny_purge": True})
    return out
