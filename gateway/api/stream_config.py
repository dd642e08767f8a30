"""StreamConfig as JetStream has it: decoded, defaulted and validated as nats-server does. Pure: a
decoded request in (``REQUEST``, read by :func:`gateway.api.requests.load_request`), a
:class:`~gateway.api.configs.StreamConfig` (or an ApiError) out; the model renders itself back as
the real server would, since clients read it and send it back on update.

The checks follow nats-server's ``jsStreamCreateRequest`` and ``checkStreamCfg`` in their order, so
a request with several faults gets the same (first) error. Fields jetlake cannot honour are refused
last, once the request is otherwise valid (see docs/compatibility.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.api import errors
from gateway.api.configs import ConsumerLimits, StreamConfig
from gateway.api.requests import API_LEVEL
from gateway.api.structs import (
    BOOL,
    DURATION,
    INT,
    INT32,
    INT64,
    SOURCES,
    STRING,
    STRING_MAP,
    STRINGS,
    UINT,
    Enum,
    Struct,
)
from storage_delta.format.nats import is_valid_subject, subject_matches, subjects_overlap
from storage_delta.format.subject_transform import (
    BAD_SUBJECT,
    MappingError,
    SubjectTransform,
    validate_mapping,
)

DEFAULT_DUPLICATE_WINDOW_NS = 120_000_000_000
MIN_WINDOW_NS = 100_000_000
MAX_NAME_LEN = 255
MAX_DESCRIPTION_LEN = 4096
MAX_METADATA_LEN = 128 * 1024

#: ``StreamConfigRequest`` as the server decodes it, strictly: these fields with these Go types.
CONSUMER_LIMITS = Struct(
    "server.StreamConsumerLimits", {"inactive_threshold": DURATION, "max_ack_pending": INT}
)
REQUEST = Struct(
    "server.StreamConfigRequest",
    {
        "name": STRING,
        "description": STRING,
        "subjects": STRINGS,
        "retention": Enum(("limits", "interest", "workqueue")),
        "max_consumers": INT,
        "max_msgs": INT64,
        "max_bytes": INT64,
        "max_age": DURATION,
        "max_msgs_per_subject": INT64,
        "max_msg_size": INT32,
        "discard": Enum(("old", "new"), fold_case=True),
        "storage": Enum(("file", "memory")),
        "num_replicas": INT,
        "no_ack": BOOL,
        "duplicate_window": DURATION,
        "placement": Struct("server.Placement"),
        "mirror": Struct("server.StreamSource"),
        "sources": SOURCES,
        "compression": Enum(
            ("none", "s2"),
            "unknown compression algorithm",
            type_wording="json: cannot unmarshal {kind} into Go value of type string",
        ),
        "first_seq": UINT,
        "subject_transform": Struct("server.SubjectTransformConfig"),
        "republish": Struct("server.RePublish"),
        "allow_direct": BOOL,
        "mirror_direct": BOOL,
        "discard_new_per_subject": BOOL,
        "sealed": BOOL,
        "deny_delete": BOOL,
        "deny_purge": BOOL,
        "allow_rollup_hdrs": BOOL,
        "consumer_limits": CONSUMER_LIMITS,
        "allow_msg_ttl": BOOL,
        "subject_delete_marker_ttl": DURATION,
        "allow_msg_counter": BOOL,
        "allow_atomic": BOOL,
        "allow_msg_schedules": BOOL,
        "persist_mode": Enum(("async",), aliases={"default": "", "": ""}),
        "allow_batched": BOOL,
        "metadata": STRING_MAP,
        "pedantic": BOOL,
    },
)

#: Fields jetlake refuses although nats-server accepts them: it cannot do what they ask.
UNSUPPORTED = (
    ("allow_msg_counter", "message counters"),
    ("allow_msg_schedules", "message schedules"),
)


def valid_stream_name(name: str) -> bool:
    return bool(name) and not any(c in name for c in ".*> \t\r\n/\\")


def _required_api_level(req: dict[str, Any]) -> int:
    if req.get("allow_batched"):
        return 4
    if any(req.get(k) for k in ("allow_msg_counter", "allow_atomic", "allow_msg_schedules")):
        return 2
    if req.get("persist_mode") == "async":
        return 2
    return 1 if req.get("allow_msg_ttl") or (req.get("subject_delete_marker_ttl") or 0) > 0 else 0


def _invalid(text: str) -> errors.ApiError:
    return errors.STREAM_INVALID_CONFIG.format(err=text)


def check_create(req: dict[str, Any]) -> None:
    """The checks nats-server makes in its create handler before it validates the config."""
    name = req.get("name") or ""
    if "/" in name or "\\" in name:
        raise errors.STREAM_NAME_PATH_SEPARATORS
    if req.get("sealed"):
        raise _invalid("stream configuration for create can not be sealed")
    if req.get("mirror_direct") and not req.get("mirror"):
        raise _invalid("stream has no mirror but does have mirror direct")


def _limit(cfg: dict[str, Any], key: str, pedantic: bool) -> None:
    """JetStream reads 0 and anything below -1 as "no limit" (-1); pedantic refuses the latter."""
    value = cfg[key]
    if value == 0 or value < -1:
        if pedantic and value < -1:
            raise errors.PEDANTIC.format(err=f"{key} must be set to -1")
        cfg[key] = -1


def normalize(req: dict[str, Any], server_version: str) -> StreamConfig:
    """The config a decoded create request asks for, with JetStream's defaults, validated as
    ``checkStreamCfg`` validates it; raises the ApiError the real server answers with."""
    pedantic = bool(req.get("pedantic"))
    name = _checked_name(req)
    if len(req.get("description") or "") > MAX_DESCRIPTION_LEN:
        raise _invalid(f"stream description is too long, maximum allowed is {MAX_DESCRIPTION_LEN}")
    metadata = _checked_metadata(req)
    cfg = _base_config(req, name, pedantic)
    _check_max_age(cfg["max_age"])
    mirror, sources = req.get("mirror"), req.get("sources") or []
    window = _duplicate_window(req, cfg["max_age"], mirror is not None or bool(sources), pedantic)
    flags = {k: bool(req.get(k)) for k in _FLAGS}
    if flags["deny_purge"] and flags["allow_rollup_hdrs"]:
        raise _invalid("roll-ups require the purge permission")
    if req.get("discard_new_per_subject"):
        _check_discard_new_per_subject(cfg)
    marker_ttl = req.get("subject_delete_marker_ttl", 0)
    flags = _with_marker_ttl(marker_ttl, flags, pedantic)
    if mirror is not None:
        _check_mirror(req, cfg, sources, marker_ttl)
    if sources and req.get("allow_msg_schedules"):
        raise errors.SOURCE_WITH_MSG_SCHEDULES
    _check_sources(sources)
    _check_external([mirror, *sources] if mirror else sources, cfg["subjects"])
    if not cfg["subjects"] and mirror is None and not sources:
        cfg["subjects"] = [name]
    _check_subjects(cfg["subjects"], bool(req.get("no_ack")))
    if req.get("persist_mode") == "async" and req.get("allow_atomic"):
        raise _invalid("async persist mode is not supported with atomic batch publish")
    transform = _checked_subject_transform(req.get("subject_transform"))
    republish = _checked_republish(req, cfg["subjects"], pedantic)
    if (req.get("placement") or {}).get("preferred"):
        raise _invalid("preferred server not permitted in placement")
    _check_supported(req)
    _check_origins_supported(mirror, sources)
    req = {
        **req,
        "subject_transform": transform,
        "republish": republish,
        "mirror": _origin_config(mirror) if mirror else None,
        "sources": [_origin_config(s) for s in sources],
    }
    return _render(cfg, req, window, flags, marker_ttl, metadata, server_version)


#: The booleans a config keeps, some of which the subject delete marker TTL turns on or off.
_FLAGS = (
    "allow_direct",
    "mirror_direct",
    "sealed",
    "deny_delete",
    "deny_purge",
    "allow_rollup_hdrs",
    "allow_msg_ttl",
)


def _checked_name(req: dict[str, Any]) -> str:
    """The name becomes a subject token and a folder name."""
    name: str = req.get("name") or ""
    if not valid_stream_name(name):
        raise _invalid("stream name is required and can not contain '.', '*', '>', '\\', '/'")
    if len(name) > MAX_NAME_LEN:
        raise _invalid(f"stream name is too long, maximum allowed is {MAX_NAME_LEN}")
    return name


def _checked_metadata(req: dict[str, Any]) -> dict[str, str]:
    """The user's metadata and the API level the config needs (the server sets the other
    ``_nats.`` keys when it renders the config); its size counts that level too."""
    metadata = {k: v for k, v in (req.get("metadata") or {}).items() if k not in ("_nats.ver", "_nats.level")}
    metadata["_nats.req.level"] = str(_required_api_level(req))
    if sum(len(k) + len(v) for k, v in metadata.items()) > MAX_METADATA_LEN:
        raise _invalid(f"stream metadata exceeds maximum size of {MAX_METADATA_LEN} bytes")
    return metadata


def _base_config(req: dict[str, Any], name: str, pedantic: bool) -> dict[str, Any]:
    """The fields every config has, with JetStream's defaults; the limits with "none" as -1."""
    cfg: dict[str, Any] = {
        "name": name,
        "description": req.get("description") or "",
        "subjects": list(req.get("subjects") or []),
        "retention": req.get("retention", "limits"),
        "max_consumers": req.get("max_consumers", 0),
        "max_msgs": req.get("max_msgs", 0),
        "max_bytes": req.get("max_bytes", 0),
        "max_age": req.get("max_age", 0),
        "max_msgs_per_subject": req.get("max_msgs_per_subject", 0),
        "max_msg_size": req.get("max_msg_size", 0),
        "discard": req.get("discard", "old"),
        "storage": req.get("storage", "file"),
        "num_replicas": req.get("num_replicas", 0) or 1,
    }
    if cfg["num_replicas"] > errors.MAX_REPLICAS:
        raise _invalid(f"maximum replicas is {errors.MAX_REPLICAS}")
    if cfg["num_replicas"] < 0:
        raise errors.REPLICAS_NEGATIVE
    for key in ("max_msgs", "max_msgs_per_subject", "max_bytes", "max_msg_size", "max_consumers"):
        _limit(cfg, key, pedantic)
    return cfg


def _check_max_age(max_age: int) -> None:
    if max_age < 0:
        raise _invalid("max age can not be negative")
    if max_age and max_age < MIN_WINDOW_NS:
        raise _invalid("max age needs to be >= 100ms")


def _duplicate_window(req: dict[str, Any], max_age: int, copies: bool, pedantic: bool) -> int:
    """Unset, the window is two minutes, or the max age when that is shorter: ids are not kept
    longer than their messages (pedantic refuses instead). A mirror or a stream with sources
    (``copies``) keeps 0."""
    window: int = req.get("duplicate_window", 0)
    if window == 0 and not copies:
        if max_age and max_age < DEFAULT_DUPLICATE_WINDOW_NS:
            if pedantic:
                raise errors.PEDANTIC.format(err="duplicate window cannot be bigger than max age")
            window = max_age
        else:
            window = DEFAULT_DUPLICATE_WINDOW_NS
    if window < 0:
        raise _invalid("duplicates window can not be negative")
    if max_age and window > max_age:
        raise _invalid("duplicates window can not be larger then max age")
    if 0 < window < MIN_WINDOW_NS:
        raise _invalid("duplicates window needs to be >= 100ms")
    return window


def _check_discard_new_per_subject(cfg: dict[str, Any]) -> None:
    """A per-subject refusal needs a per-subject limit to refuse at."""
    if cfg["discard"] != "new":
        raise _invalid("discard new per subject requires discard new policy to be set")
    if cfg["max_msgs_per_subject"] <= 0:
        raise _invalid("discard new per subject requires max msgs per subject > 0")


def _with_marker_ttl(marker_ttl: int, flags: dict[str, bool], pedantic: bool) -> dict[str, bool]:
    """A subject delete marker is a message with a TTL that rolls up its subject: a marker TTL
    turns message TTLs and roll-ups on (pedantic refuses instead)."""
    if marker_ttl < 0:
        raise _invalid("subject delete marker TTL must not be negative")
    if marker_ttl == 0:
        return flags
    if marker_ttl < 1_000_000_000:
        raise _invalid("subject delete marker TTL must be at least 1 second")
    out = dict(flags)
    if not out["allow_msg_ttl"]:
        if pedantic:
            raise _invalid("subject delete marker cannot be set if message TTLs are disabled")
        out["allow_msg_ttl"] = True
    if not out["allow_rollup_hdrs"]:
        if pedantic:
            raise _invalid("subject delete marker cannot be set if roll-ups are disabled")
        out["allow_rollup_hdrs"], out["deny_purge"] = True, False
    return out


#: Stream features a mirror cannot have (it stores its origin's messages as they are), in the
#: server's order.
_NOT_ON_MIRRORS = (
    ("allow_msg_counter", errors.MIRROR_WITH_COUNTERS),
    ("allow_atomic", errors.MIRROR_WITH_ATOMIC_PUBLISH),
    ("allow_batched", errors.MIRROR_WITH_BATCH_PUBLISH),
    ("allow_msg_schedules", errors.MIRROR_WITH_MSG_SCHEDULES),
)


def _check_mirror(req: dict[str, Any], cfg: dict[str, Any], sources: list[Any], marker_ttl: int) -> None:
    """A mirror's messages, sequences and subjects are its origin's."""
    mirror = req["mirror"]
    if req.get("first_seq"):
        raise errors.MIRROR_WITH_FIRST_SEQ
    if cfg["subjects"]:
        raise errors.MIRROR_WITH_SUBJECTS
    if sources:
        raise errors.MIRROR_WITH_SOURCES
    for flag, refusal in _NOT_ON_MIRRORS:
        if req.get(flag):
            raise refusal
    if mirror.get("filter_subject") and mirror.get("subject_transforms"):
        raise errors.MIRROR_MULTIPLE_FILTERS
    if marker_ttl > 0:
        raise _invalid("subject delete markers forbidden on mirrors")
    _check_mirror_transforms(mirror.get("subject_transforms") or [])
    if not mirror.get("external") and not valid_stream_name(mirror.get("name") or ""):
        raise errors.MIRROR_INVALID_STREAM_NAME


def _check_mirror_transforms(transforms: list[dict[str, Any]]) -> None:
    for i, t in enumerate(transforms):
        _check_origin_transform(t, errors.MIRROR_INVALID_FILTER, errors.MIRROR_INVALID_TRANSFORM)
        others = [u.get("src") or ">" for j, u in enumerate(transforms) if j != i]
        if any(subjects_overlap(t.get("src") or ">", other) for other in others):
            raise errors.MIRROR_OVERLAPPING_FILTERS


def _check_sources(sources: list[Any]) -> None:
    """Each source names a stream once (by origin, filters and destinations), with filters that are
    subjects and transforms that map."""
    seen: set[tuple[str, str, str]] = set()
    for src in sources:
        if not isinstance(src, dict) or not valid_stream_name(src.get("name") or ""):
            raise errors.SOURCE_INVALID_STREAM_NAME
        key = origin_index(src)
        if key in seen:
            raise errors.SOURCE_DUPLICATE
        seen.add(key)
        transforms = src.get("subject_transforms") or []
        if src.get("filter_subject") and transforms:
            raise errors.SOURCE_MULTIPLE_FILTERS
        for t in transforms:
            _check_origin_transform(t, errors.SOURCE_INVALID_FILTER, errors.SOURCE_INVALID_TRANSFORM)
        for i, t in enumerate(transforms):
            for j, u in enumerate(transforms):
                if i != j and subject_matches(u.get("src") or ">", t.get("src") or ">"):
                    raise errors.SOURCE_OVERLAPPING_FILTERS


_HASH_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def server_hash(name: str, size: int = 8) -> str:
    """The server's ``getHash``: the first ``size`` bytes of a SHA-256, each as one of 62 digits."""
    digest = hashlib.sha256(name.encode()).digest()
    return "".join(_HASH_DIGITS[b % 62] for b in digest[:size])


def origin_index(src: Mapping[str, Any]) -> tuple[str, str, str]:
    """How the server names a mirror or source (``composeIName``): the origin (an external one's
    name with a hash of its API prefix: the same name can stand in several domains), its filters
    and its destinations (``>`` for none; several joined by form feeds)."""
    external = src.get("external") or {}
    name = str(src.get("name"))
    iname = f"{name}:{server_hash(external.get('api') or '')}" if external else name
    transforms = src.get("subject_transforms") or []
    if transforms:
        filters = "\f".join(t.get("src") or ">" for t in transforms)
        dests = "\f".join(t.get("dest") or ">" for t in transforms)
    else:
        filters, dests = src.get("filter_subject") or ">", ">"
    return iname, filters, dests


def _check_origin_transform(
    t: dict[str, Any], bad_source: errors.ApiError, bad_dest: errors.ApiError
) -> None:
    source, dest = t.get("src") or "", t.get("dest") or ""
    if source and not is_valid_subject(source):
        raise bad_source.format(err=f"{BAD_SUBJECT} {source}")
    try:
        validate_mapping(source, dest)
    except MappingError as exc:
        raise bad_dest.format(err=exc) from None


def _origin_config(src: dict[str, Any]) -> dict[str, Any]:
    """A mirror or source as the server keeps it (``StreamSource``, empty fields left out)."""
    out: dict[str, Any] = {"name": src.get("name") or ""}
    for key in ("opt_start_seq", "opt_start_time", "filter_subject"):
        if src.get(key):
            out[key] = src[key]
    if src.get("subject_transforms"):
        out["subject_transforms"] = [
            {"src": t.get("src") or "", "dest": t.get("dest") or ""} for t in src["subject_transforms"]
        ]
    external = src.get("external")
    if external:
        out["external"] = {"api": external.get("api") or "", "deliver": external.get("deliver") or ""}
    if src.get("consumer"):
        out["consumer"] = src["consumer"]
    return out


def _check_external(origins: list[dict[str, Any]], subjects: list[str]) -> None:
    """An external origin's prefixes: subjects a client may publish to, the delivery prefix apart
    from the stream's subjects, the API prefix apart from this account's own API."""
    for src in origins:
        external = src.get("external") or {}
        deliver, prefix = external.get("deliver") or "", external.get("api") or ""
        if deliver:
            if not is_valid_subject(deliver, allow_wildcards=False):
                raise errors.STREAM_INVALID_EXTERNAL_DELIVERY_SUBJECT.format(prefix=deliver)
            for subject in subjects:
                if subjects_overlap(subject, f"{deliver}.{subject}"):
                    raise errors.STREAM_EXTERNAL_DELIVERY_PREFIX_OVERLAPS.format(
                        prefix=deliver, subject=subject
                    )
        if prefix:
            if not is_valid_subject(prefix, allow_wildcards=False):
                raise _invalid(
                    f'stream external api prefix "{prefix}" must be a valid subject without wildcards'
                )
            if subjects_overlap(prefix, "$JS.API"):
                raise errors.STREAM_EXTERNAL_API_OVERLAP.format(prefix=prefix, subject="$JS.API")


def _checked_subject_transform(transform: dict[str, Any] | None) -> dict[str, str] | None:
    """The transform applied to every stored message's subject: a valid source and destination
    (both kept, as the server's struct has no ``omitempty``)."""
    if not transform:
        return None
    source, dest = transform.get("src") or "", transform.get("dest") or ""
    if source and not is_valid_subject(source):
        raise errors.STREAM_TRANSFORM_INVALID_SOURCE.format(err=f"{BAD_SUBJECT} {source}")
    try:
        validate_mapping(source, dest)
    except MappingError as exc:
        raise errors.STREAM_TRANSFORM_INVALID_DESTINATION.format(err=exc) from None
    return {"src": source, "dest": dest}


def _checked_republish(req: dict[str, Any], subjects: list[str], pedantic: bool) -> dict[str, Any] | None:
    """The republish directive as the stream keeps it: an empty source means every subject; a
    ``>`` to ``>`` beside a transform of the one stream subject republishes the transformed
    subjects; a destination among the stream's own subjects would store its own copies again."""
    republish = req.get("republish")
    if not republish:
        return None
    out = {"src": republish.get("src") or "", "dest": republish.get("dest") or ""}
    if republish.get("headers_only"):
        out["headers_only"] = True
    if not out["src"]:
        if pedantic:
            raise errors.PEDANTIC.format(err="republish source can not be empty")
        out["src"] = ">"
    transform = req.get("subject_transform")
    if (out["src"], out["dest"]) == (">", ">") and transform and subjects == [transform.get("src")]:
        if pedantic:
            raise errors.PEDANTIC.format(err="implicit republish based on subject transform")
        out["src"] = out["dest"] = transform.get("dest") or ""
    if any(subjects_overlap(out["dest"], subject) for subject in subjects):
        raise _invalid("stream configuration for republish destination forms a cycle")
    try:
        SubjectTransform.parse(out["src"], out["dest"])
    except MappingError:
        what = f"republish with transform from '{out['src']}' to '{out['dest']}'"
        raise _invalid(f"stream configuration for {what} not valid") from None
    return out


def _check_origins_supported(mirror: dict[str, Any] | None, sources: list[Any]) -> None:
    """jetlake follows its origins through consumers of its own making, not durable ones."""
    for src in [mirror, *sources] if mirror else sources:
        if src.get("consumer"):
            raise _invalid("mirrors and sources through a durable consumer are not supported by jetlake")


def _check_supported(req: dict[str, Any]) -> None:
    """Last, once the real server would accept the config: what jetlake cannot do."""
    for field, what in UNSUPPORTED:
        if req.get(field):
            raise _invalid(f"{what} are not supported by jetlake")


def _check_subjects(subjects: list[str], no_ack: bool) -> None:
    seen: set[str] = set()
    for i, subj in enumerate(subjects):
        if not is_valid_subject(subj):
            raise _invalid("invalid subject")
        if subj in seen:
            raise _invalid("duplicate subjects detected")
        if subj == ">" and not no_ack:
            raise _invalid("capturing all subjects requires no-ack to be true")
        if not no_ack:
            for namespace in ("$JS.>", "$JSC.>", "$NRG.>"):
                if subjects_overlap(subj, namespace) and not subject_matches("$JS.EVENT.>", subj):
                    raise _invalid("subjects that overlap with jetstream api require no-ack to be true")
            if subjects_overlap(subj, "$SYS.>") and not subject_matches("$SYS.ACCOUNT.>", subj):
                raise _invalid("subjects that overlap with system api require no-ack to be true")
        for other in subjects[i + 1 :]:
            if subjects_overlap(other, subj):
                raise _invalid(f'subject "{subj}" overlaps with "{other}"')
        seen.add(subj)


def _render(
    cfg: dict[str, Any],
    req: dict[str, Any],
    window: int,
    flags: dict[str, bool],
    marker_ttl: int,
    metadata: dict[str, str],
    server_version: str,
) -> StreamConfig:
    """The config, with the server's own metadata keys."""
    limits = req.get("consumer_limits") or {}
    return StreamConfig(
        **{**cfg, "subjects": tuple(cfg["subjects"])},
        no_ack=bool(req.get("no_ack")),
        duplicate_window=window,
        placement=req.get("placement") or None,
        mirror=req.get("mirror") or None,
        sources=tuple(req.get("sources") or ()),
        compression=req.get("compression", "none"),
        first_seq=req.get("first_seq", 0),
        subject_transform=req.get("subject_transform") or None,
        republish=req.get("republish") or None,
        discard_new_per_subject=bool(req.get("discard_new_per_subject")),
        consumer_limits=ConsumerLimits(limits.get("inactive_threshold", 0), limits.get("max_ack_pending", 0)),
        subject_delete_marker_ttl=marker_ttl,
        persist_mode=req.get("persist_mode", ""),
        metadata={**metadata, "_nats.level": str(API_LEVEL), "_nats.ver": server_version},
        allow_direct=flags["allow_direct"],
        mirror_direct=flags["mirror_direct"],
        sealed=flags["sealed"],
        deny_delete=flags["deny_delete"],
        deny_purge=flags["deny_purge"],
        allow_rollup_hdrs=flags["allow_rollup_hdrs"],
        allow_msg_ttl=flags["allow_msg_ttl"],
        allow_atomic=bool(req.get("allow_atomic")),
        allow_batched=bool(req.get("allow_batched")),
    )


def same_config(a: StreamConfig, b: StreamConfig) -> bool:
    """Whether two configs are equal, ignoring the server-owned metadata."""
    return replace(a, metadata={}) == replace(b, metadata={})
