"""JetStream API requests: routing by subject and the answers, rendered as the real server renders.

Handlers are coroutines on a :class:`~gateway.registry.Registry`; they return the response body, or
``None`` where the real server stays silent.
"""

from __future__ import annotations

import json
from typing import Any

from gateway import consumer_config, errors, stream_config
from gateway.registry import Registry
from gateway.subjects import subjects_overlap
from gateway.timefmt import now_ns, rfc3339

T = "io.nats.jetstream.api.v1."
NAMES_PAGE = 1024


def split_api_subject(subject: str, prefix: str) -> list[str] | None:
    """The tokens after the API prefix (``$JS.<domain>.API.``), or None when it is not an API call."""
    if not subject.startswith(prefix):
        return None
    return subject[len(prefix) :].split(".")


def _load(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise errors.INVALID_JSON.format(err=exc.msg) from exc
    if not isinstance(value, dict):
        raise errors.INVALID_JSON.format(err="json: cannot unmarshal into Go value of type object")
    return value


class Api:
    def __init__(self, registry: Registry) -> None:
        self.reg = registry

    async def handle(self, toks: list[str], body: bytes) -> dict[str, Any] | None:
        """Answer one API request; unknown subjects get no answer, as from the real server."""
        op = ".".join(toks[:2])
        try:
            if toks == ["INFO"]:
                return self.account_info()
            if op == "STREAM.CREATE" and len(toks) == 3:
                return await self.stream_create(toks[2], body)
            if op == "STREAM.NAMES" and len(toks) == 2:
                return self.stream_names(body)
            if op == "STREAM.INFO" and len(toks) == 3:
                return self.stream_info(toks[2])
            if op == "CONSUMER.CREATE" and len(toks) >= 3:
                return await self.consumer_create(
                    toks[2],
                    toks[3] if len(toks) > 3 else None,
                    ".".join(toks[4:]) or None,
                    body,
                    durable_subject=False,
                )
            if op == "CONSUMER.DURABLE" and len(toks) == 5 and toks[2] == "CREATE":
                return await self.consumer_create(toks[3], toks[4], None, body, durable_subject=True)
            if op == "CONSUMER.INFO" and len(toks) == 4:
                return self.consumer_info(toks[2], toks[3])
        except errors.ApiError as err:
            answer: dict[str, Any] = {"type": T + _response_type(toks), "error": err.render()}
            if op == "STREAM.NAMES":
                answer.update({"total": 0, "offset": 0, "limit": 0, "streams": None})
            return answer
        return None

    def account_info(self) -> dict[str, Any]:
        streams = self.reg.streams.values()
        return {
            "type": T + "account_info_response",
            "memory": 0,
            "storage": sum(s.state.bytes for s in streams),
            "reserved_memory": 0,
            "reserved_storage": 0,
            "streams": len(self.reg.streams),
            "consumers": sum(len(c) for c in self.reg.consumers.values()),
            "limits": {
                "max_memory": -1,
                "max_storage": -1,
                "max_streams": -1,
                "max_consumers": -1,
                "max_ack_pending": -1,
                "memory_max_stream_bytes": -1,
                "storage_max_stream_bytes": -1,
                "max_bytes_required": False,
            },
            "api": {"level": 5, "total": self.reg.api_total, "errors": self.reg.api_errors},
        }

    async def stream_create(self, name: str, body: bytes) -> dict[str, Any]:
        raw = _load(body)
        if raw.get("name", name) != name or not raw:
            raise errors.STREAM_MISMATCH
        raw["name"] = name
        cfg = stream_config.normalize(raw, self.reg.server_version)
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
        req = _load(body)
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

    async def consumer_create(
        self,
        stream_name: str,
        name: str | None,
        filter_subject: str | None,
        body: bytes,
        durable_subject: bool,
    ) -> dict[str, Any]:
        raw = _load(body)
        if raw.get("stream_name") and raw["stream_name"] != stream_name:
            raise errors.STREAM_MISMATCH
        stream = self.reg.streams.get(stream_name)
        if stream is None:
            raise errors.STREAM_NOT_FOUND
        cfg_in = dict(raw.get("config") or {})
        if durable_subject and cfg_in.get("durable_name") and cfg_in["durable_name"] != name:
            raise errors.CONSUMER_DURABLE_NAME_NOT_MATCH_SUBJECT
        if durable_subject:
            cfg_in["durable_name"] = name
        if filter_subject and cfg_in.get("filter_subject") not in (None, filter_subject):
            raise errors.CONSUMER_FILTER_NOT_MATCH_SUBJECT
        cfg = consumer_config.normalize(cfg_in, self.reg.server_version)
        cname = cfg.get("name") or name
        if not cname:
            raise errors.CONSUMER_CREATE.format(err="ephemeral consumers are not supported yet")
        existing = self.reg.consumers.get(stream_name, {}).get(cname)
        action = raw.get("action", "")
        if existing is not None:
            if action == "create" and existing.config != cfg:
                raise errors.CONSUMER_ALREADY_EXISTS
            consumer = existing
        else:
            consumer = await self.reg.add_consumer(stream, cfg, now_ns())
        return {"type": T + "consumer_create_response", **consumer.info(stream_name, now_ns())}

    def consumer_info(self, stream_name: str, name: str) -> dict[str, Any]:
        if stream_name not in self.reg.streams:
            raise errors.STREAM_NOT_FOUND
        consumer = self.reg.consumers.get(stream_name, {}).get(name)
        if consumer is None:
            raise errors.CONSUMER_NOT_FOUND
        return {"type": T + "consumer_info_response", **consumer.info(stream_name, now_ns())}


_RESPONSE_TYPES = {
    "INFO": "account_info_response",
    "STREAM.CREATE": "stream_create_response",
    "STREAM.INFO": "stream_info_response",
    "STREAM.NAMES": "stream_names_response",
    "CONSUMER.CREATE": "consumer_create_response",
    "CONSUMER.DURABLE": "consumer_create_response",
    "CONSUMER.INFO": "consumer_info_response",
}


def _response_type(toks: list[str]) -> str:
    return _RESPONSE_TYPES.get(".".join(toks[:2]), _RESPONSE_TYPES.get(toks[0], "error_response"))
