"""The consumer half of the JetStream API: CONSUMER.* requests (MSG.NEXT is delivery's, not here).

Handlers return the response body or raise :class:`~gateway.errors.ApiError`.
"""

from __future__ import annotations

from typing import Any

from gateway import consumer_config, errors
from gateway.apicommon import T, load_request
from gateway.registry import Registry
from gateway.timefmt import now_ns

RESPONSE_TYPES = {
    "CONSUMER.CREATE": "consumer_create_response",
    "CONSUMER.DURABLE": "consumer_create_response",
    "CONSUMER.INFO": "consumer_info_response",
}


class ConsumerApi:
    def __init__(self, registry: Registry) -> None:
        self.reg = registry

    async def handle(self, toks: list[str], body: bytes) -> dict[str, Any] | None:
        op = ".".join(toks[:2])
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
        return None

    async def consumer_create(
        self,
        stream_name: str,
        name: str | None,
        filter_subject: str | None,
        body: bytes,
        durable_subject: bool,
    ) -> dict[str, Any]:
        raw = load_request(body)
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
