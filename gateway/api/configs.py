"""Stream and consumer configs as typed values: what the engine and the service read, and what the
API renders back as JSON exactly as nats-server does.

Each model lists its fields in the order of nats-server's Go struct, with the Go struct's
``omitempty`` marked, so rendering is Go's: fields in order, an ``omitempty`` field left out when it
holds its zero value. A config is built once, by the API's validation
(:mod:`gateway.api.stream_config`, :mod:`gateway.api.consumer_config`) or from what the catalog
stored (:func:`from_json`, which refuses a key it does not know rather than dropping it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

#: The metadata of a field Go renders only when it is not its zero value.
OMIT = {"omitempty": True}
#: The metadata of an embedded struct, whose fields Go renders in its parent's place.
EMBED = {"embed": True}
#: An opaque JSON object the server keeps as sent (placement, mirror, republish, ...).
JsonObject = Mapping[str, Any]

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class ConsumerLimits:
    """A stream's caps and defaults for its consumers' ``inactive_threshold`` and ``max_ack_pending``."""

    inactive_threshold: int = field(default=0, metadata=OMIT)
    max_ack_pending: int = field(default=0, metadata=OMIT)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """A validated stream config: limits are -1 for "none" (as JetStream shows them), durations
    nanoseconds."""

    name: str
    description: str = field(default="", metadata=OMIT)
    subjects: tuple[str, ...] = field(default=(), metadata=OMIT)
    retention: str = "limits"
    max_consumers: int = -1
    max_msgs: int = -1
    max_bytes: int = -1
    max_age: int = 0
    max_msgs_per_subject: int = -1
    max_msg_size: int = -1
    discard: str = "old"
    storage: str = "file"
    num_replicas: int = 1
    no_ack: bool = field(default=False, metadata=OMIT)
    duplicate_window: int = field(default=0, metadata=OMIT)
    placement: JsonObject | None = field(default=None, metadata=OMIT)
    mirror: JsonObject | None = field(default=None, metadata=OMIT)
    sources: tuple[JsonObject, ...] = field(default=(), metadata=OMIT)
    compression: str = "none"
    first_seq: int = field(default=0, metadata=OMIT)
    subject_transform: JsonObject | None = field(default=None, metadata=OMIT)
    republish: JsonObject | None = field(default=None, metadata=OMIT)
    allow_direct: bool = False
    mirror_direct: bool = False
    discard_new_per_subject: bool = field(default=False, metadata=OMIT)
    sealed: bool = False
    deny_delete: bool = False
    deny_purge: bool = False
    allow_rollup_hdrs: bool = False
    consumer_limits: ConsumerLimits = field(default_factory=ConsumerLimits)
    allow_msg_ttl: bool = False
    subject_delete_marker_ttl: int = field(default=0, metadata=OMIT)
    allow_atomic: bool = field(default=False, metadata=OMIT)
    persist_mode: str = field(default="", metadata=OMIT)
    allow_batched: bool = field(default=False, metadata=OMIT)
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A validated consumer config; durations in nanoseconds, times as the RFC 3339 text sent."""

    durable_name: str = field(default="", metadata=OMIT)
    name: str = field(default="", metadata=OMIT)
    description: str = field(default="", metadata=OMIT)
    deliver_policy: str = "all"
    opt_start_seq: int = field(default=0, metadata=OMIT)
    opt_start_time: str = field(default="", metadata=OMIT)
    ack_policy: str = "none"
    ack_wait: int = field(default=0, metadata=OMIT)
    max_deliver: int = -1
    backoff: tuple[int, ...] = field(default=(), metadata=OMIT)
    filter_subject: str = field(default="", metadata=OMIT)
    filter_subjects: tuple[str, ...] = field(default=(), metadata=OMIT)
    replay_policy: str = "instant"
    rate_limit_bps: int = field(default=0, metadata=OMIT)
    sample_freq: str = field(default="", metadata=OMIT)
    max_waiting: int = field(default=0, metadata=OMIT)
    max_ack_pending: int = field(default=0, metadata=OMIT)
    headers_only: bool = field(default=False, metadata=OMIT)
    max_batch: int = field(default=0, metadata=OMIT)
    max_expires: int = field(default=0, metadata=OMIT)
    max_bytes: int = field(default=0, metadata=OMIT)
    flow_control: bool = field(default=False, metadata=OMIT)
    deliver_subject: str = field(default="", metadata=OMIT)
    deliver_group: str = field(default="", metadata=OMIT)
    idle_heartbeat: int = field(default=0, metadata=OMIT)
    inactive_threshold: int = field(default=0, metadata=OMIT)
    num_replicas: int = 0
    direct: bool = field(default=False, metadata=OMIT)
    mem_storage: bool = field(default=False, metadata=OMIT)
    metadata: Mapping[str, str] = field(default_factory=dict)
    pause_until: str = field(default="", metadata=OMIT)
    priority_groups: tuple[str, ...] = field(default=(), metadata=OMIT)
    #: ``overflow``, ``pinned_client`` or ``prioritized``; "" for none, which the server leaves out
    priority_policy: str = field(default="", metadata=OMIT)
    priority_timeout: int = field(default=0, metadata=OMIT)

    @property
    def filters(self) -> tuple[str, ...]:
        """The subjects it delivers from (none: all of the stream's)."""
        return (self.filter_subject,) if self.filter_subject else self.filter_subjects

    @property
    def is_push(self) -> bool:
        return bool(self.deliver_subject)


def to_json(config: Any) -> dict[str, Any]:
    """A model as nats-server renders its Go struct: fields in order, ``omitempty`` ones left out
    at their zero value (a nested struct is never left out, as in Go), an embedded struct's fields
    in its place."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("embed"):
            out.update(to_json(value))
        elif not (f.metadata.get("omitempty") and not value):
            out[f.name] = _json_value(value)
    return out


def _json_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


def from_json(model: type[M], data: Mapping[str, Any]) -> M:
    """A model from its JSON rendering (what the catalog stored, or a validated request's parts):
    absent fields at their default, lists as tuples, nested structs decoded; an unknown key is an
    error, so nothing a config held is dropped unnoticed."""
    hints, names = _fields_of(model)
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{model.__name__} has no field {sorted(unknown)}")
    values = {key: _from_json_value(hints[key], value) for key, value in data.items()}
    return model(**values)


#: Each model's field types and names, by model (``_fields_of``).
_FIELDS: dict[type, tuple[dict[str, Any], frozenset[str]]] = {}


def _fields_of(model: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A model's field types and names, worked out once per model: ``get_type_hints`` evaluates
    every annotation anew on each call, which was a fifth of the event loop's time in consumer
    creates and updates (#23)."""
    found = _FIELDS.get(model)
    if found is None:
        fields = dataclasses.fields(model)
        found = _FIELDS[model] = (typing.get_type_hints(model), frozenset(f.name for f in fields))
    return found


def _from_json_value(hint: Any, value: Any) -> Any:
    if typing.get_origin(hint) is tuple:
        return tuple(value)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return from_json(hint, value)
    return value
