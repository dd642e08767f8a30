"""The stream half of the JetStream API: STREAM.* requests, answered from the live registry.

Handlers return the response body or raise :class:`~gateway.errors.ApiError`; the router in
:mod:`gateway.api` renders errors and stays silent on subjects nobody handles.
"""

from __future__ import annotations

from typing import Any

from gateway import errors, stream_config
from gateway.apicommon import NAMES_PAGE, T, load_request
from gateway.registry import Registry
from gateway.subjects import subjects_overlap
from gateway.timefmt import now_ns, rfc3339

RESPONSE_TYPES = {
    "STREAM.CREATE": "stream_create_response",
    "STREAM.INFO": "stream_info_response",
    "STREAM.NAMES": "stream_names_response",
}


class StreamApi:
    def __init__(self, registry: Registry) -> None:
        self.reg = registry

    async def handle(self, toks: list[str], body: bytes) -> dict[str, Any] | None:
        op = ".".join(toks[:2])
        if op == "STREAM.CREATE" and len(toks) == 3:
            return await self.stream_create(toks[2], body)
        if op == "STREAM.NAMES" and len(toks) == 2:
            return self.stream_names(body)
        if op == "STREAM.INFO" and len(toks) == 3:
            return self.stream_info(toks[2])
        return None

    async def stream_create(self, name: str, body: bytes) -> dict[str, Any]:
        raw = load_request(body)
        req = stream_config.decode(raw)
        if req.get("name") != name:
            raise errors.STREAM_MISMATCH
        req["name"] = name
        stream_config.check_create(req)
        cfg = stream_config.normalize(req, self.reg.server_version)
        existing = self.reg.streams.get(name)
        if existing is not None:
            if not stream_config.same_config(existing.config, cfg):
                raise errors.STREAM_NAME_EXISTS
            stream = existing
        else:
            for other in self.reg.streams.values():
                if any(subjects_overlap(a, b) for a in cfg["subjects"] for b in other.subjects):
                    raise errors.STREAM_SUBJECT_OVERLAP
            stream = await self.reg.add_stream(cfg, now_ns())
        return {
            "type": T + "stream_create_response",
            **self._stream_body(stream),
            "did_create": True,
        }

    def stream_names(self, body: bytes) -> dict[str, Any]:
        req = load_request(body)
        subject = req.get("subject") or ""
        offset = int(req.get("offset") or 0)
        names = sorted(
            name
            for name, stream in self.reg.streams.items()
            if not subject or any(subjects_overlap(subject, s) for s in stream.subjects)
        )
        page = names[offset : offset + NAMES_PAGE]
        return {
            "type": T + "stream_names_response",
            "total": len(names),
            "offset": offset,
            "limit": NAMES_PAGE,
            "streams": page or None,
        }

    def stream_info(self, name: str) -> dict[str, Any]:
        stream = self.reg.streams.get(name)
        if stream is None:
            return {
                "type": T + "stream_info_response",
                "error": errors.STREAM_NOT_FOUND.render(),
                "total": 0,
                "offset": 0,
                "limit": 0,
            }
        return {
            "type": T + "stream_info_response",
            "total": 0,
            "offset": 0,
            "limit": 0,
            **self._stream_body(stream),
        }

    def _stream_body(self, stream: Any) -> dict[str, Any]:
        return {
            "config": stream.config,
            "created": rfc3339(stream.created_ns),
            "state": stream.info_state(len(self.reg.consumers.get(stream.name, {}))),
            "ts": rfc3339(now_ns()),
        }
