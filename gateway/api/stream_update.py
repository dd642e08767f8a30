"""STREAM.UPDATE rules: which changes of a stream's config JetStream allows, and what sealing implies.

Pure: takes the stream's current config and the normalized requested one, returns the config to
store or raises the real server's error (descriptions read from nats-server's ``server/stream.go``
and pinned by differential tests).
"""

from __future__ import annotations

from dataclasses import replace

from gateway.api import errors
from gateway.api.configs import StreamConfig


def _invalid(text: str) -> errors.ApiError:
    return errors.STREAM_INVALID_CONFIG.format(err=f"stream configuration update can not {text}")


#: Flags an update may turn on but not off, with the server's words for turning them off.
_ONE_WAY = (
    ("sealed", "stream configuration update can not unseal a sealed stream"),
    ("deny_delete", "stream configuration update can not cancel deny message deletes"),
    ("deny_purge", "stream configuration update can not cancel deny purge"),
    ("allow_msg_ttl", "message TTL status can not be disabled"),
)


def apply_update(old: StreamConfig, new: StreamConfig) -> StreamConfig:
    """The config an update leaves the stream with, or the error JetStream answers (the checks in
    the server's order)."""
    if new.storage != old.storage:
        raise _invalid("change storage type")
    if new.retention != old.retention and "workqueue" in (new.retention, old.retention):
        raise _invalid("change retention policy to/from workqueue")
    for flag, words in _ONE_WAY:
        if getattr(old, flag) and not getattr(new, flag):
            raise errors.STREAM_INVALID_CONFIG.format(err=words)
    if old.persist_mode != new.persist_mode:
        raise _invalid("change persist mode")
    if new.republish and not new.republish.get("dest"):
        # The server's update fills in an empty destination, as its create does not.
        new = replace(new, republish={**new.republish, "dest": ">"})
    if new.sealed:
        # A sealed stream takes no more messages and loses none.
        return replace(
            new, max_age=0, discard="new", deny_delete=True, deny_purge=True, allow_rollup_hdrs=False
        )
    return new
