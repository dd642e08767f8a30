"""Mirrors and stream sources, with no I/O: which origin messages a mirror or a source takes, and
what each becomes in the stream that copies it.

A mirror keeps its origin's sequences (gaps included) and times; a source appends to its stream
under new sequences, with a ``Nats-Stream-Source`` header that says where the message came from
(``<origin> <origin seq> <filter> <destination> <original subject> <origin identity>``, the
server's format). Subject filters and transforms are the config's (``filter_subject``, or
``subject_transforms``: the first whose source matches maps the subject). The rules and words are
nats-server's (``server/stream.go``: ``composeIName``, ``genSourceHeader``, ``processInboundSourceMsg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.api.stream_config import server_hash
from gateway.api.timefmt import rfc3339
from storage_delta.format.subject_transform import SubjectTransform


def stream_identity(created_ns: int) -> str:
    """The identity a stream gives its copies' ``Nats-Stream-Source``: a hash of its creation time,
    so a stream deleted and created again under the same name is told apart."""
    return server_hash(rfc3339(created_ns))


@dataclass(frozen=True, slots=True)
class OriginSpec:
    """One mirror or source of a stream's config, compiled."""

    name: str
    #: How the server names the origin in its copies' headers: an external one's name carries a
    #: hash of its API prefix (the same name can stand in several domains).
    iname: str
    opt_start_seq: int
    opt_start_time: str
    #: The origin subjects it takes (empty: all).
    filters: tuple[str, ...]
    transforms: tuple[SubjectTransform | None, ...]
    #: The server's index name: origin, filters and destinations (``composeIName``); what a source
    #: is known by in the stream's info and its copies' headers.
    filter_text: str
    dest_text: str

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> OriginSpec:
        transforms = cfg.get("subject_transforms") or []
        if transforms:
            sources = [t.get("src") or ">" for t in transforms]
            dests = [t.get("dest") or ">" for t in transforms]
            compiled = tuple(
                SubjectTransform.parse(t.get("src") or "", t.get("dest") or "") for t in transforms
            )
            filters = tuple(t.get("src") or ">" for t in transforms)
            filter_text, dest_text = "\f".join(sources), "\f".join(dests)
        else:
            only = cfg.get("filter_subject") or ""
            compiled, filters = (), ((only,) if only else ())
            filter_text, dest_text = only or ">", ">"
        external = cfg.get("external") or {}
        iname = f"{cfg['name']}:{server_hash(external.get('api') or '')}" if external else cfg["name"]
        return cls(
            name=cfg["name"],
            iname=iname,
            opt_start_seq=int(cfg.get("opt_start_seq") or 0),
            opt_start_time=str(cfg.get("opt_start_time") or ""),
            filters=tuple(f for f in filters if f != ">"),
            transforms=compiled,
            filter_text=filter_text,
            dest_text=dest_text,
        )

    @property
    def key(self) -> str:
        """What tells this source apart from the stream's others (the server's index name)."""
        return f"{self.iname} {self.filter_text} {self.dest_text}"

    def subject_for(self, subject: str) -> str:
        """The subject a copy is stored under: the first transform whose source matches maps it."""
        for transform in self.transforms:
            if transform is not None and (mapped := transform.match(subject)) is not None:
                return mapped
        return subject


#: Header prefixes a copy drops from its origin message (the server's): an earlier source's header,
#: and expectations and batch markers that were the origin's to check.
_DROPPED = (b"Nats-Stream-Source:", b"Nats-Expected-", b"Nats-Batch-")


def sourced_headers(
    spec: OriginSpec, hdrs: bytes | None, origin_seq: int, subject: str, identity: str
) -> bytes:
    """The header block of a source's copy: the origin's headers but the dropped ones, then the
    ``Nats-Stream-Source`` line."""
    lines = [
        line for line in (hdrs or b"NATS/1.0\r\n\r\n").split(b"\r\n")[:-2] if not line.startswith(_DROPPED)
    ]
    lines = lines or [b"NATS/1.0"]
    source = f"{spec.iname} {origin_seq} {spec.filter_text} {spec.dest_text} {subject}"
    source += f" {identity}" if identity else ""
    return b"\r\n".join([*lines, b"Nats-Stream-Source: " + source.encode(), b"", b""])
