"""ConsumerConfig as JetStream has it: validated, defaults filled in, rendered back as the real
server does, and the rules for what an update may change.

Every check below was asked of ``nats-server -js`` 2.15.1; the error values live in
:mod:`gateway.errors`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime
from typing import Any

from gateway.api import errors
from gateway.api.configs import ConsumerConfig, ConsumerLimits, StreamConfig, from_json, to_json
from gateway.api.durations import go_duration
from gateway.api.structs import (
    BOOL,
    DURATION,
    DURATIONS,
    INT,
    STRING,
    STRING_MAP,
    STRINGS,
    TIME,
    UINT,
    Enum,
    Struct,
)
from storage_delta.format.nats import is_valid_subject, subjects_overlap

FLOW_CONTROL_HEARTBEAT_NS = 1_000_000_000
MIN_HEARTBEAT_NS = 100_000_000
MAX_DESCRIPTION_LEN = 4096
MAX_METADATA_LEN = 128 * 1024

DEFAULT_ACK_WAIT_NS = 30_000_000_000
DEFAULT_MAX_WAITING = 512
DEFAULT_MAX_ACK_PENDING = 1000
DEFAULT_INACTIVE_THRESHOLD_NS = 5_000_000_000
DELIVER_POLICIES = ("all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject")
ACK_POLICIES = ("none", "all", "explicit", "flow_control")
REPLAY_POLICIES = ("instant", "original")
PRIORITY_POLICIES = ("none", "overflow", "pinned_client", "prioritized")
#: How long a ``pinned_client`` pin lasts without a pull from its holder, unless set (the server's
#: ``JsDefaultPinnedTTL``).
DEFAULT_PRIORITY_TIMEOUT_NS = 120_000_000_000
_PRIORITY_FIELDS = ("priority_policy", "priority_groups", "priority_timeout")
#: A priority group's name (``validGroupName``), in configs, pull requests and CONSUMER.UNPIN.
GROUP_NAME = re.compile(r"[A-Za-z0-9/_=-]{1,16}")

#: ``ConsumerConfig`` as the server decodes it, strictly: these fields with these Go types (the
#: policies are enums that refuse any other value, ``null`` too).
CONFIG = Struct(
    "server.ConsumerConfig",
    {
        "durable_name": STRING,
        "name": STRING,
        "description": STRING,
        "deliver_policy": Enum(DELIVER_POLICIES),
        "opt_start_seq": UINT,
        "opt_start_time": TIME,
        "ack_policy": Enum(ACK_POLICIES),
        "ack_wait": DURATION,
        "max_deliver": INT,
        "backoff": DURATIONS,
        "filter_subject": STRING,
        "filter_subjects": STRINGS,
        "replay_policy": Enum(REPLAY_POLICIES),
        "rate_limit_bps": UINT,
        "sample_freq": STRING,
        "max_waiting": INT,
        "max_ack_pending": INT,
        "flow_control": BOOL,
        "idle_heartbeat": DURATION,
        "headers_only": BOOL,
        "max_batch": INT,
        "max_expires": DURATION,
        "max_bytes": INT,
        "deliver_subject": STRING,
        "deliver_group": STRING,
        "inactive_threshold": DURATION,
        "num_replicas": INT,
        "mem_storage": BOOL,
        "direct": BOOL,
        "sourcing": BOOL,
        "metadata": STRING_MAP,
        "pause_until": TIME,
        "priority_groups": STRINGS,
        "priority_policy": Enum(PRIORITY_POLICIES, "unknown priority policy: {text}"),
        "priority_timeout": DURATION,
    },
)

#: Copied through when set (truthy), in the order the real server renders them.
_PASS_THROUGH = (
    "rate_limit_bps",
    "sample_freq",
)
_PULL_LIMITS = ("max_batch", "max_expires", "max_bytes")
_PUSH_FIELDS = ("flow_control", "deliver_subject", "deliver_group", "idle_heartbeat")

#: What an update may not change, with the real server's words (500/10012).
_FROZEN = (
    ("deliver_policy", "deliver policy can not be updated"),
    ("opt_start_seq", "start sequence can not be updated"),
    ("opt_start_time", "start time can not be updated"),
    ("ack_policy", "ack policy can not be updated"),
    ("replay_policy", "replay policy can not be updated"),
    ("idle_heartbeat", "heartbeats can not be updated"),
    ("flow_control", "flow control can not be updated"),
    ("max_waiting", "max waiting can not be updated"),
    ("mem_storage", "storage type can not be updated"),
)


def _policy(raw: dict[str, Any], key: str, default: str) -> str:
    """A policy field (its value checked when the request was decoded, see ``CONFIG``)."""
    return str(raw.get(key) or default)


def _policy_error(policy: str, what: str) -> errors.ApiError:
    words = {
        "all": "deliver all",
        "last": "deliver last",
        "new": "deliver new",
        "last_per_subject": "deliver last per subject",
        "by_start_sequence": "deliver by start sequence",
        "by_start_time": "deliver by start time",
    }[policy]
    return errors.CONSUMER_INVALID_POLICY.format(err=f"consumer delivery policy is {words}, but {what}")


def _check_start(policy: str, raw: dict[str, Any]) -> None:
    seq, start = raw.get("opt_start_seq") or 0, raw.get("opt_start_time")
    if policy == "by_start_sequence":
        if not seq:
            raise _policy_error(policy, "optional start sequence is not set")
        if start:
            raise _policy_error(policy, "optional start time is also set")
    elif policy == "by_start_time":
        if not start:
            raise _policy_error(policy, "optional start time is not set")
        if seq:
            raise _policy_error(policy, "optional start sequence is also set")
    else:
        if seq:
            raise _policy_error(policy, "optional start sequence is also set")
        if start:
            raise _policy_error(policy, "optional start time is also set")
    if policy == "last_per_subject" and not (raw.get("filter_subject") or raw.get("filter_subjects")):
        raise _policy_error(policy, "optional filter subject is not set")


def _check_filters(raw: dict[str, Any]) -> list[str]:
    single = raw.get("filter_subject") or ""
    many = list(raw.get("filter_subjects") or [])
    if single and many:
        raise errors.CONSUMER_BOTH_FILTERS
    if single and not is_valid_subject(single):
        raise errors.CONSUMER_INVALID_SUBJECT
    if not all(many):  # an empty string, or null
        raise errors.CONSUMER_EMPTY_FILTER
    filters = [single] if single else many
    for f in filters:
        if not is_valid_subject(f):
            raise errors.CONSUMER_INVALID_SUBJECT
    for i, a in enumerate(filters):
        if any(subjects_overlap(a, b) for b in filters[i + 1 :]):
            raise errors.CONSUMER_OVERLAPPING_FILTERS
    return filters


def _req_level(pause_until: str, ack_policy: str, priority: bool) -> str:
    """``_nats.req.level``: the API level the config needs (ADR-44); a pause and priority groups
    came with level 1."""
    if ack_policy == "flow_control":
        return "4"
    return "1" if pause_until or priority else "0"


def with_pause(cfg: ConsumerConfig, until: str) -> ConsumerConfig:
    """The config after ``CONSUMER.PAUSE``: ``pause_until`` set or cleared, the level to match."""
    priority = bool(cfg.priority_policy or cfg.priority_groups or cfg.priority_timeout)
    level = _req_level(until, cfg.ack_policy, priority)
    return replace(cfg, pause_until=until, metadata={**cfg.metadata, "_nats.req.level": level})


def listed(cfg: ConsumerConfig) -> dict[str, Any]:
    """The config as ``CONSUMER.LIST`` shows it: without the server's dynamic metadata."""
    meta = {k: v for k, v in cfg.metadata.items() if k not in ("_nats.level", "_nats.ver")}
    return to_json(replace(cfg, metadata=meta))


def _check_limits(raw: dict[str, Any], limits: ConsumerLimits) -> None:
    """The stream's ``consumer_limits`` cap what a consumer may ask for (10121, 10153)."""
    cap = limits.max_ack_pending
    if cap > 0 and int(raw.get("max_ack_pending") or 0) > cap:
        raise errors.CONSUMER_MAX_ACK_PENDING_LIMIT.format(limit=cap)
    cap = limits.inactive_threshold
    if cap > 0 and int(raw.get("inactive_threshold") or 0) > cap:
        raise errors.CONSUMER_INACTIVE_THRESHOLD_LIMIT.format(limit=go_duration(cap))


#: Pedantic mode refuses these values instead of reading them as the default (10157).
_PEDANTIC_FLOORS = (
    ("max_deliver", -1, "max_deliver must be set to -1"),
    ("max_waiting", 0, "max_waiting must not be negative"),
    ("max_ack_pending", -1, "max_ack_pending must be set to -1"),
    ("max_batch", 0, "max_batch must not be negative"),
    ("max_expires", 0, "max_expires must not be negative"),
    ("max_bytes", 0, "max_bytes must not be negative"),
    ("idle_heartbeat", 0, "idle_heartbeat must not be negative"),
    ("inactive_threshold", 0, "inactive_threshold must not be negative"),
    ("priority_timeout", 0, "priority_timeout must not be negative"),
)


def _check_pedantic(raw: dict[str, Any], limits: ConsumerLimits) -> None:
    """A ``pedantic`` create: where the server would change a value to fit, it refuses instead,
    in the order it fills the defaults in."""
    for key, floor, words in _PEDANTIC_FLOORS:
        if int(raw.get(key) or 0) < floor:
            raise errors.PEDANTIC.format(err=words)
    backoff = raw.get("backoff") or []
    ack_wait = int(raw.get("ack_wait") or 0)
    if not ack_wait and raw.get("ack_policy") in ("explicit", "all"):
        ack_wait = DEFAULT_ACK_WAIT_NS
    if backoff and ack_wait != backoff[0]:
        raise errors.PEDANTIC.format(err="first backoff value has to equal batch AckWait")
    for key in ("max_ack_pending", "inactive_threshold"):
        if not raw.get(key) and getattr(limits, key) > 0:
            raise errors.PEDANTIC.format(err=f"{key} must be set if it's configured in stream limits")


def _fit(raw: dict[str, Any]) -> dict[str, Any]:
    """What the server does where pedantic mode refuses: a value below its floor becomes the floor."""
    low = {key: floor for key, floor, _ in _PEDANTIC_FLOORS if int(raw.get(key) or 0) < floor}
    return {**raw, **low}


def _check_ack_flow_control(raw: dict[str, Any], push: bool) -> None:
    """``ack_policy: flow_control`` (2.15): push only, with flow control and a 1 s heartbeat (which
    the server sets unless pedantic), a positive ack pending limit, no ack wait, backoff or
    max deliver."""
    if not push:
        raise errors.ACK_FC_REQUIRES_PUSH
    if not raw.get("flow_control"):
        raise errors.ACK_FC_REQUIRES_FC
    if int(raw.get("idle_heartbeat") or 0) != FLOW_CONTROL_HEARTBEAT_NS:
        raise errors.STREAM_INVALID_CONFIG.format(err="flow control ack policy heartbeat needs to be 1s")
    if int(raw.get("max_ack_pending") or 0) < 0:
        raise errors.ACK_FC_REQUIRES_MAX_ACK_PENDING
    if raw.get("ack_wait") or raw.get("backoff"):
        raise errors.ACK_FC_REQUIRES_NO_ACK_WAIT
    if int(raw.get("max_deliver") or 0) > 0:
        raise errors.ACK_FC_REQUIRES_NO_MAX_DELIVER


def _check_deliver_subject(subject: str, stream_subjects: tuple[str, ...]) -> None:
    """A push consumer's deliver subject: a literal, valid subject outside the stream's own
    subjects (else every delivery would be stored again)."""
    if any(c in subject for c in "*>"):
        raise errors.CONSUMER_DELIVER_WILDCARDS
    if not is_valid_subject(subject):
        raise errors.CONSUMER_INVALID_DELIVER_SUBJECT
    if any(subjects_overlap(subject, s) for s in stream_subjects):
        raise errors.CONSUMER_DELIVER_CYCLE


def _check_name(name: str) -> None:
    """A name becomes a subject token and a folder name: no separators of either."""
    if "/" in name or "\\" in name:
        raise errors.CONSUMER_NAME_PATH_SEPARATORS
    if any(c in name for c in ".*>"):
        raise errors.STREAM_INVALID_CONFIG.format(
            err="consumer name can not contain '.', '*', '>', '\\', '/'"
        )


def _check_not_negative(raw: dict[str, Any]) -> None:
    """The server refuses these before the rules that read them, so a negative one is the error."""
    if int(raw.get("num_replicas") or 0) < 0:
        raise errors.REPLICAS_NEGATIVE
    backoff = [int(b) for b in raw.get("backoff") or []]
    if any(b < 0 for b in backoff):
        raise errors.CONSUMER_BACKOFF_NEGATIVE
    if int(raw.get("ack_wait") or 0) < 0:
        raise errors.CONSUMER_ACK_WAIT_NEGATIVE


def _check_push(raw: dict[str, Any], ack_policy: str, heartbeat: int, stream: StreamConfig | None) -> None:
    """A push consumer sends unasked to a subject: nothing waits on it, a pending limit needs acks
    to release it, and a heartbeat below 100 ms would flood the subscriber."""
    _check_deliver_subject(raw["deliver_subject"], stream.subjects if stream else ())
    if int(raw.get("max_waiting") or 0) > 0:
        raise errors.CONSUMER_PUSH_MAX_WAITING
    if int(raw.get("max_ack_pending") or 0) > 0 and ack_policy == "none":
        raise errors.CONSUMER_MAX_PENDING_NEEDS_ACKS
    if 0 < heartbeat < MIN_HEARTBEAT_NS:
        raise errors.CONSUMER_SMALL_HEARTBEAT


def _check_pull(raw: dict[str, Any], heartbeat: int) -> None:
    """What only a push consumer may ask for; a pull consumer's own floor on ``max_expires``."""
    if raw.get("rate_limit_bps"):
        raise errors.CONSUMER_PULL_RATE_LIMIT
    if heartbeat:
        raise errors.CONSUMER_HEARTBEAT_REQUIRES_PUSH
    if raw.get("flow_control"):
        raise errors.CONSUMER_FLOW_CONTROL_REQUIRES_PUSH
    if 0 < int(raw.get("max_expires") or 0) < 1_000_000:
        raise errors.CONSUMER_MAX_EXPIRES_TOO_SMALL


def _check_config(raw: dict[str, Any], ack_policy: str, stream: StreamConfig | None) -> list[str]:
    """The server's checks of a consumer config (``checkConsumerCfg``), in its order, once the
    values it changes to fit are changed; the filters, checked."""
    _check_name(str(raw.get("name") or ""))
    _check_not_negative(raw)
    push = bool(raw.get("deliver_subject"))
    if ack_policy == "flow_control":
        _check_ack_flow_control(raw, push)
    max_deliver = int(raw.get("max_deliver") or 0)
    if max_deliver > 0 and len(raw.get("backoff") or []) > max_deliver:
        raise errors.CONSUMER_MAX_DELIVER_BACKOFF
    if len(str(raw.get("description") or "")) > MAX_DESCRIPTION_LEN:
        raise errors.CONSUMER_DESCRIPTION_TOO_LONG
    heartbeat = int(raw.get("idle_heartbeat") or 0)
    if push:
        _check_push(raw, ack_policy, heartbeat, stream)
    else:
        _check_pull(raw, heartbeat)
    _check_limits(raw, stream.consumer_limits if stream else ConsumerLimits())
    if raw.get("direct") and not push:
        raise errors.CONSUMER_DIRECT_REQUIRES_PUSH
    filters = _check_filters(raw)
    _check_start(_policy(raw, "deliver_policy", "all"), raw)
    _check_sample_freq(str(raw.get("sample_freq") or ""))
    if raw.get("flow_control") and not heartbeat:
        raise errors.CONSUMER_FLOW_CONTROL_NEEDS_HEARTBEATS
    metadata = raw.get("metadata") or {}
    if sum(len(k) + len(v or "") for k, v in metadata.items()) > MAX_METADATA_LEN:
        raise errors.CONSUMER_METADATA_TOO_LONG
    _check_priority(raw, push)
    return filters


def _check_priority(raw: dict[str, Any], push: bool) -> None:
    """Priority groups (ADR-42): a policy needs groups with valid names and a pull consumer; no
    policy allows neither groups nor a ``priority_timeout``."""
    groups = raw.get("priority_groups") or []
    if _policy(raw, "priority_policy", "none") != "none":
        if push:
            raise errors.PRIORITY_GROUPS_WITH_PUSH
        if not groups:
            raise errors.PRIORITY_POLICY_WITHOUT_GROUP
        for group in groups:
            if not group:
                raise errors.PRIORITY_GROUP_EMPTY_NAME
            if not GROUP_NAME.fullmatch(group):
                raise errors.INVALID_GROUP_NAME
    elif groups:
        raise errors.PRIORITY_GROUPS_WITH_POLICY_NONE
    elif int(raw.get("priority_timeout") or 0) > 0:
        raise errors.PRIORITY_TIMEOUT_WITH_POLICY_NONE


def _check_sample_freq(freq: str) -> None:
    """``sample_freq`` is a whole percentage (``80`` or ``80%``), read by Go's ``strconv.Atoi``."""
    if not freq:
        return
    text = freq.removesuffix("%")
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        trouble = f'strconv.Atoi: parsing "{text}": invalid syntax'
    elif not -(2**63) <= int(text) < 2**63:
        trouble = f'strconv.Atoi: parsing "{text}": value out of range'
    elif int(text) < 0:
        trouble = "<nil>"
    else:
        return
    raise errors.CONSUMER_INVALID_SAMPLING.format(err=trouble)


def normalize(
    raw: dict[str, Any], server_version: str, stream: StreamConfig | None = None, pedantic: bool = False
) -> ConsumerConfig:
    """The config a create request asks for, checked and with JetStream's defaults. A raw request
    without ``ack_policy`` gets ``none`` (the JSON zero value); a consumer without a durable name
    is ephemeral and goes away after 5 s without interest. The stream's ``consumer_limits`` set
    the defaults of ``max_ack_pending`` and ``inactive_threshold`` (durables included) and cap them.
    ``pedantic`` refuses a value the server would otherwise change to fit (10157)."""
    limits = stream.consumer_limits if stream else ConsumerLimits()
    if pedantic:
        _check_pedantic(raw, limits)
    # the server sets the required API level from the config as sent: a negative timeout counts
    priority = any(raw.get(k) not in (None, "", "none", 0, []) for k in _PRIORITY_FIELDS)
    raw = _fit(raw)
    if int(raw.get("num_replicas") or 0) > (stream.num_replicas if stream else 1):
        raise errors.CONSUMER_REPLICAS_EXCEED_STREAM
    ack_policy = _policy(raw, "ack_policy", "none")
    if ack_policy == "flow_control" and not pedantic:
        raw = {**raw, "flow_control": True, "idle_heartbeat": FLOW_CONTROL_HEARTBEAT_NS}
    filters = _check_config(raw, ack_policy, stream)
    fields = {
        **_identity_fields(raw),
        **_start_fields(raw),
        **_ack_fields(raw, ack_policy),
        **_filter_fields(raw, filters),
        "replay_policy": _policy(raw, "replay_policy", "instant"),
        **{key: raw[key] for key in _PASS_THROUGH if raw.get(key)},
        **_limit_fields(raw, ack_policy, limits),
        "num_replicas": int(raw.get("num_replicas") or 0),
        **_storage_fields(raw),
        "metadata": _metadata(raw, ack_policy, priority, server_version),
        **({"pause_until": raw["pause_until"]} if raw.get("pause_until") else {}),
        **_priority_fields(raw),
    }
    return from_json(ConsumerConfig, fields)


# The parts of a normalized config, each in the real server's field order: the API answers with
# exactly the JSON the real server would.


def _identity_fields(raw: dict[str, Any]) -> dict[str, Any]:
    durable = raw.get("durable_name") or ""
    name = raw.get("name") or durable
    out: dict[str, Any] = {}
    if durable:
        out["durable_name"] = durable
    if name:
        out["name"] = name
    if raw.get("description"):
        out["description"] = raw["description"]
    return out


def _start_fields(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"deliver_policy": _policy(raw, "deliver_policy", "all")}
    if raw.get("opt_start_seq"):
        out["opt_start_seq"] = int(raw["opt_start_seq"])
    if raw.get("opt_start_time"):
        out["opt_start_time"] = raw["opt_start_time"]
    return out


def _ack_fields(raw: dict[str, Any], ack_policy: str) -> dict[str, Any]:
    """The first backoff step is the ack wait; a consumer without acks has none."""
    ack_wait = int(raw.get("ack_wait") or 0)
    backoff = [int(b) for b in raw.get("backoff") or []]
    max_deliver = int(raw.get("max_deliver") or 0)
    out: dict[str, Any] = {"ack_policy": ack_policy}
    if ack_policy not in ("none", "flow_control") or backoff:
        out["ack_wait"] = backoff[0] if backoff else ack_wait or DEFAULT_ACK_WAIT_NS
    out["max_deliver"] = max_deliver if max_deliver > 0 else -1
    if backoff:
        out["backoff"] = backoff
    return out


def _filter_fields(raw: dict[str, Any], filters: list[str]) -> dict[str, Any]:
    """One filter stays in the field it was asked in."""
    if filters and raw.get("filter_subject"):
        return {"filter_subject": filters[0]}
    return {"filter_subjects": filters} if filters else {}


def _limit_fields(raw: dict[str, Any], ack_policy: str, limits: ConsumerLimits) -> dict[str, Any]:
    """The stream's ``consumer_limits`` are the defaults of ``max_ack_pending`` and
    ``inactive_threshold``; a push consumer has no waiting requests to limit."""
    out: dict[str, Any] = {}
    if not raw.get("deliver_subject"):
        waiting = int(raw.get("max_waiting") or 0)
        out["max_waiting"] = waiting if waiting > 0 else DEFAULT_MAX_WAITING
    pending = int(raw.get("max_ack_pending") or 0)
    pending_cap = limits.max_ack_pending
    if ack_policy != "none" or pending or pending_cap > 0:
        out["max_ack_pending"] = pending or (pending_cap if pending_cap > 0 else DEFAULT_MAX_ACK_PENDING)
    if raw.get("headers_only"):
        out["headers_only"] = True
    for key in _PULL_LIMITS:
        if int(raw.get(key) or 0) > 0:
            out[key] = int(raw[key])
    for key in _PUSH_FIELDS:
        if raw.get(key):
            out[key] = raw[key]
    inactive = int(raw.get("inactive_threshold") or 0)
    inactive_cap = limits.inactive_threshold
    if inactive > 0:
        out["inactive_threshold"] = inactive
    elif inactive_cap > 0:
        out["inactive_threshold"] = inactive_cap
    elif not raw.get("durable_name"):
        out["inactive_threshold"] = DEFAULT_INACTIVE_THRESHOLD_NS
    return out


def _priority_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """Groups as given, the policy unless none, and ``pinned_client``'s default timeout."""
    policy = _policy(raw, "priority_policy", "none")
    if policy == "none":
        return {}
    timeout = int(raw.get("priority_timeout") or 0)
    if policy == "pinned_client" and not timeout:
        timeout = DEFAULT_PRIORITY_TIMEOUT_NS
    groups = list(raw["priority_groups"])
    return {"priority_groups": groups, "priority_policy": policy, "priority_timeout": timeout}


def _storage_fields(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if raw.get("direct"):
        out["direct"] = True  # accepted and echoed; served as an ordinary push consumer
    if raw.get("mem_storage"):
        out["mem_storage"] = True
    return out


def _metadata(raw: dict[str, Any], ack_policy: str, priority: bool, server_version: str) -> dict[str, str]:
    """The user's metadata; the ``_nats.`` keys are the server's to set."""
    req_level = _req_level(str(raw.get("pause_until") or ""), ack_policy, priority)
    metadata = {k: v or "" for k, v in (raw.get("metadata") or {}).items() if not k.startswith("_nats.")}
    metadata.update({"_nats.level": "5", "_nats.req.level": req_level, "_nats.ver": server_version})
    return metadata


def check_update(old: ConsumerConfig, new: ConsumerConfig) -> None:
    """Refuse an update that changes what JetStream keeps fixed for a consumer's life."""
    if old.is_push != new.is_push:
        raise errors.CONSUMER_CREATE.format(
            err="can not update pull consumer to push based"
            if new.is_push
            else "can not update push consumer to pull based"
        )
    for key, words in _FROZEN:
        if getattr(old, key) != getattr(new, key):
            raise errors.CONSUMER_CREATE.format(err=words)


def same_config(old: ConsumerConfig, new: ConsumerConfig) -> bool:
    """Whether a create repeats the existing config (the server-set metadata aside)."""
    return replace(old, metadata=_user_metadata(old)) == replace(new, metadata=_user_metadata(new))


def _user_metadata(cfg: ConsumerConfig) -> dict[str, str]:
    return {k: v for k, v in cfg.metadata.items() if not k.startswith("_nats.")}


def parse_time_ns(text: str) -> int:
    """An RFC 3339 time (Go's rendering, nanoseconds allowed) as Unix nanoseconds."""
    match = re.match(r"^(.*?)(?:\.(\d+))?([+-]\d\d:\d\d)$", text.replace("Z", "+00:00"))
    if match is None:
        raise ValueError(text)
    base, frac, tz = match.groups()
    secs = int(datetime.fromisoformat(base + tz).timestamp())
    return secs * 1_000_000_000 + int(((frac or "") + "000000000")[:9])
