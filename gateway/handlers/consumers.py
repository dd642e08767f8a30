"""The consumer half of the JetStream API: CONSUMER.* requests (MSG.NEXT is delivery's, not here).

Handlers return the response body or raise :class:`~gateway.errors.ApiError`. Subject forms, as
clients send them: ``CONSUMER.CREATE.<stream>`` (ephemeral), ``CONSUMER.CREATE.<stream>.<name>``
and ``CONSUMER.CREATE.<stream>.<name>.<filter…>``, ``CONSUMER.DURABLE.CREATE.<stream>.<durable>``,
``INFO``, ``DELETE``, ``NAMES``, ``LIST`` and ``PAUSE``.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from gateway.adapters.registry import Registry
from gateway.api import advisories, consumer_config, errors
from gateway.api.configs import ConsumerConfig
from gateway.api.requests import (
    NAMES_PAGE,
    Publish,
    T,
    load_request,
    require_empty_request,
    unmarshal_request,
)
from gateway.api.responses import (
    Answer,
    ConsumerInfo,
    ConsumerInfoResponse,
    ConsumerPauseResponse,
    ConsumerResetResponse,
    ConsumersResponse,
    ConsumerUnpinResponse,
    Paged,
    Route,
    SuccessResponse,
)
from gateway.api.structs import BOOL, INT, STRING, TIME, UINT, Enum, go, request_type
from gateway.api.timefmt import ZERO_TIME, now_ns
from gateway.engine import priority, retention
from gateway.engine.consumer import Consumer, reset_refusal, start_position
from gateway.engine.consumer_effects import Listeners, push_bound
from gateway.engine.stream import Stream

LIST_PAGE = 256

RESPONSE_TYPES = {
    "CONSUMER.CREATE": "consumer_create_response",
    "CONSUMER.DURABLE": "consumer_create_response",
    "CONSUMER.INFO": "consumer_info_response",
    "CONSUMER.DELETE": "consumer_delete_response",
    "CONSUMER.NAMES": "consumer_names_response",
    "CONSUMER.LIST": "consumer_list_response",
    "CONSUMER.PAUSE": "consumer_pause_response",
    "CONSUMER.RESET": "consumer_reset_response",
    "CONSUMER.UNPIN": "consumer_unpin_response",
}

#: Fields the real server adds to an error answer of these requests.
ERROR_EXTRAS: dict[str, dict[str, Any]] = {
    "CONSUMER.PAUSE": {"paused": False, "pause_until": ZERO_TIME},
    "CONSUMER.NAMES": {"total": 0, "offset": 0, "limit": 0, "consumers": []},
    "CONSUMER.LIST": {"total": 0, "offset": 0, "limit": 0, "consumers": []},
    "CONSUMER.RESET": {"reset_seq": 0},
}

# The requests, as the real server's Go structs (strictly decoded, but for RESET and UNPIN).


@dataclass(frozen=True, slots=True)
class CreateConsumerRequest:
    stream_name: str = go(STRING, "")
    #: the config's fields as sent (its validation needs to know which were)
    config: dict[str, Any] | None = go(consumer_config.CONFIG, None)
    #: ConsumerAction, which refuses anything but these (null and other case included)
    action: str = go(Enum(("", "create", "update"), "unknown consumer action: {text}"), "")
    pedantic: bool = go(BOOL, False)


@dataclass(frozen=True, slots=True)
class ConsumersRequest:
    offset: int = go(INT, 0)


@dataclass(frozen=True, slots=True)
class ConsumerPauseRequest:
    pause_until: str = go(TIME, "")


@dataclass(frozen=True, slots=True)
class ConsumerResetRequest:
    seq: int = go(UINT, 0)


@dataclass(frozen=True, slots=True)
class ConsumerUnpinRequest:
    group: str = go(STRING, "")


CREATE_REQUEST = request_type(CreateConsumerRequest, "server.CreateConsumerRequest")
PAGING_REQUEST = request_type(ConsumersRequest, "server.JSApiConsumersRequest")
PAUSE_REQUEST = request_type(ConsumerPauseRequest, "server.JSApiConsumerPauseRequest")
RESET_REQUEST = request_type(ConsumerResetRequest, "server.JSApiConsumerResetRequest", strict=False)
UNPIN_REQUEST = request_type(ConsumerUnpinRequest, "server.JSApiConsumerUnpinRequest", strict=False)

#: The first stream sequence stored at or after a time (``deliver_policy: by_start_time``).
SeqAtTime = Callable[[Stream, int], Awaitable[int | None]]
#: Where advisories go (subject, body).

_NAME_CHARS = string.ascii_lowercase + string.digits


def _check_subject_names(
    cfg: dict[str, Any], name: str | None, filter_subject: str | None, durable_subject: bool
) -> None:
    """The names and filter in the request subject must agree with the config's (an ephemeral
    create names no consumer; the legacy ``CONSUMER.DURABLE.CREATE`` needs a durable name)."""
    durable = cfg.get("durable_name")
    if name is None and durable:
        raise errors.CONSUMER_EPHEMERAL_WITH_DURABLE
    if name is not None and durable and durable != name:
        raise errors.CONSUMER_DURABLE_NAME_NOT_MATCH_SUBJECT
    if durable_subject and not durable:
        raise errors.CONSUMER_DURABLE_NAME_NOT_SET
    if filter_subject and cfg.get("filter_subject") != filter_subject:
        raise errors.CONSUMER_FILTER_NOT_MATCH_SUBJECT


def ephemeral_name() -> str:
    return "".join(secrets.choice(_NAME_CHARS) for _ in range(8))


class ConsumerApi:
    def __init__(
        self, registry: Registry, seq_at_time: SeqAtTime, publish: Publish, listeners: Listeners
    ) -> None:
        self.reg = registry
        self.seq_at_time = seq_at_time
        self.publish = publish
        self.listeners = listeners

    def _info(self, consumer: Consumer, stream_name: str, now: int) -> ConsumerInfo:
        return consumer.info(stream_name, now, push_bound(consumer, self.listeners))

    def route(self, toks: list[str]) -> Route | None:
        """The handler of a consumer subject; None for a subject nobody answers."""
        op = ".".join(toks[:2])
        n = len(toks)
        if op == "CONSUMER.CREATE" and n >= 3:
            name, filtered = toks[3] if n > 3 else None, ".".join(toks[4:]) or None
            return partial(self.create, toks[2], name, filtered, durable_subject=False)
        if op == "CONSUMER.DURABLE" and n == 5 and toks[2] == "CREATE":
            return partial(self.create, toks[3], toks[4], None, durable_subject=True)
        handlers: dict[str, Callable[[str, str, bytes], Answer | Awaitable[Answer]]] = {
            "CONSUMER.INFO": self.info,
            "CONSUMER.DELETE": self.delete,
            "CONSUMER.PAUSE": self.pause,
            "CONSUMER.RESET": self.reset,
            "CONSUMER.UNPIN": self.unpin,
        }
        by_consumer = handlers.get(op)
        if by_consumer is not None and n == 4:
            return partial(by_consumer, toks[2], toks[3])
        if op in ("CONSUMER.NAMES", "CONSUMER.LIST") and n == 3:
            return partial(self.names if op == "CONSUMER.NAMES" else self.list, toks[2])
        return None

    def _stream(self, name: str) -> Stream:
        return self.reg.stream(name)

    def _consumer(self, stream_name: str, name: str) -> Consumer:
        self._stream(stream_name)
        consumer = self.reg.consumers.get(stream_name, {}).get(name)
        if consumer is None:
            raise errors.CONSUMER_NOT_FOUND
        return consumer

    async def create(
        self,
        stream_name: str,
        name: str | None,
        filter_subject: str | None,
        body: bytes,
        durable_subject: bool,
    ) -> ConsumerInfoResponse:
        req = load_request(body, CREATE_REQUEST)
        # checked before anything else: a body without it (even an empty one) is a mismatch too
        if req.stream_name != stream_name:
            raise errors.STREAM_MISMATCH
        stream = self._stream(stream_name)
        cfg_in = dict(req.config or {})
        _check_subject_names(cfg_in, name, filter_subject, durable_subject)
        if name is not None:
            cfg_in["name"] = name
        cfg = consumer_config.normalize(cfg_in, self.reg.server_version, stream.config, req.pedantic)
        cname = cfg.name or ephemeral_name()
        existing = self.reg.consumers.get(stream_name, {}).get(cname)
        now = now_ns()
        if existing is not None:
            consumer = await self._update(existing, cfg, req.action)
        else:
            consumer = await self._add(stream, cfg, cname, req.action, now)
        return ConsumerInfoResponse(
            type=T + "consumer_create_response", info=self._info(consumer, stream_name, now_ns())
        )

    async def _update(self, existing: Consumer, cfg: ConsumerConfig, action: str) -> Consumer:
        """A create of a consumer that exists: the same config is no change (even for a plain
        ``create``), a different one an update of what may change."""
        if not consumer_config.same_config(existing.config, cfg):
            if action == "create":
                raise errors.CONSUMER_ALREADY_EXISTS
            consumer_config.check_update(existing.config, cfg)
            await self.reg.update_consumer(existing, cfg)
        return existing

    async def _add(self, stream: Stream, cfg: ConsumerConfig, cname: str, action: str, now: int) -> Consumer:
        if action == "update":
            raise errors.CONSUMER_DOES_NOT_EXIST
        others = self.reg.consumers.get(stream.name, {})
        retention.check_new_consumer(stream, others.values(), cfg)
        limit = stream.config.max_consumers
        if 0 < limit <= len(others):
            raise errors.MAXIMUM_CONSUMERS_LIMIT
        time_seq = None
        if cfg.deliver_policy == "by_start_time":
            time_seq = await self.seq_at_time(stream, consumer_config.parse_time_ns(cfg.opt_start_time))
        start_after, skip = start_position(stream, cfg, time_seq)
        consumer = await self.reg.add_consumer(stream, cfg, now, cname, start_after, skip)
        self.publish(advisories.consumer_action(stream.name, cname, "create", now))
        return consumer

    def info(self, stream_name: str, name: str, body: bytes) -> ConsumerInfoResponse:
        require_empty_request(body)
        consumer = self._consumer(stream_name, name)
        return ConsumerInfoResponse(info=self._info(consumer, stream_name, now_ns()))

    async def delete(self, stream_name: str, name: str, _body: bytes) -> SuccessResponse:
        """The body is not read, as on the server."""
        consumer = self._consumer(stream_name, name)
        if await self.reg.remove_consumer(consumer):
            self.publish(advisories.consumer_action(stream_name, name, "delete", now_ns()))
            stream = self._stream(stream_name)
            others = self.reg.consumers.get(stream_name, {}).values()
            held = range(stream.state.first_seq, consumer.sseq + 1)
            retention.settle(stream, others, held if retention.policy(stream) == "interest" else ())
        return SuccessResponse(type=T + "consumer_delete_response")

    def _page(self, stream_name: str, body: bytes, size: int) -> tuple[int, int, list[Consumer]]:
        """A page of a stream's listed consumers: (offset, how many in all, the page)."""
        offset = load_request(body, PAGING_REQUEST).offset
        self._stream(stream_name)
        everyone = self.reg.listed_consumers(stream_name)
        return offset, len(everyone), everyone[offset : offset + size]

    def names(self, stream_name: str, body: bytes) -> ConsumersResponse:
        offset, total, page = self._page(stream_name, body, NAMES_PAGE)
        paged = Paged(total, offset, NAMES_PAGE)
        return ConsumersResponse(
            type=T + "consumer_names_response", paged=paged, consumers=tuple(c.name for c in page)
        )

    def list(self, stream_name: str, body: bytes) -> ConsumersResponse:
        offset, total, page = self._page(stream_name, body, LIST_PAGE)
        now = now_ns()
        listed = tuple(self._listed(c, stream_name, now) for c in page)
        paged = Paged(total, offset, LIST_PAGE)
        return ConsumersResponse(type=T + "consumer_list_response", paged=paged, consumers=listed)

    def _listed(self, consumer: Consumer, stream_name: str, now: int) -> ConsumerInfo:
        """A consumer as CONSUMER.LIST shows it: its config without the server's metadata."""
        return replace(self._info(consumer, stream_name, now), config=consumer_config.listed(consumer.config))

    async def pause(self, stream_name: str, name: str, body: bytes) -> ConsumerPauseResponse:
        until = load_request(body, PAUSE_REQUEST).pause_until  # before the look-up
        consumer = self._consumer(stream_name, name)
        await self.reg.update_consumer(consumer, consumer_config.with_pause(consumer.config, until))
        now = now_ns()
        paused = consumer.paused(now)
        shown = until or ZERO_TIME
        self.publish(advisories.pause(stream_name, name, paused, shown, now))
        remaining = consumer.paused_until_ns - now if paused else 0
        return ConsumerPauseResponse(paused=paused, pause_until=shown, pause_remaining=remaining)

    def unpin(self, stream_name: str, name: str, body: bytes) -> ConsumerUnpinResponse:
        """``CONSUMER.UNPIN`` (ADR-42) after the server's checks of the request, the group's name,
        the consumer and its groups: the pin goes (if there is one; the UNPINNED advisory goes out
        either way, as from the server), and the consumer looks at once for a puller to pin."""
        group = unmarshal_request(body, UNPIN_REQUEST).group
        if not group:
            raise errors.INVALID_JSON.format(err="consumer group not specified")
        if not consumer_config.GROUP_NAME.fullmatch(group):
            raise errors.INVALID_GROUP_NAME
        consumer = self._consumer(stream_name, name)
        if group not in consumer.config.priority_groups:
            raise errors.PRIORITY_GROUP_NOT_FOUND
        self.publish(priority.unpin(consumer, group, now_ns()))
        self.reg.consumer_changed.emit(consumer)
        return ConsumerUnpinResponse()

    async def reset(self, stream_name: str, name: str, body: bytes) -> ConsumerResetResponse | None:
        """``CONSUMER.RESET`` (2.14+): the consumer starts again at ``seq`` (or above its ack
        floor). The real server does not answer for a consumer it does not have."""
        consumer = self.reg.consumers.get(stream_name, {}).get(name)
        if consumer is None:
            return None
        seq = load_request(body, RESET_REQUEST).seq
        if seq:
            cfg = consumer.config
            time_seq = None
            if cfg.deliver_policy == "by_start_time":
                time_seq = await self.seq_at_time(
                    consumer.stream, consumer_config.parse_time_ns(cfg.opt_start_time)
                )
            refusal = reset_refusal(cfg, seq, time_seq)
            if refusal is not None:
                raise errors.CONSUMER_INVALID_RESET.format(err=refusal)
        consumer.reset(seq)
        await self.reg.recorder.reset(consumer)
        info = self._info(consumer, stream_name, now_ns())
        return ConsumerResetResponse(info=info, reset_seq=consumer.sseq + 1)
