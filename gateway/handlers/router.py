"""JetStream API requests: routing by subject and the answers, rendered as the real server renders.

Handlers are coroutines on a :class:`~gateway.registry.Registry`; they return the response body, or
``None`` where the real server stays silent.
"""

from __future__ import annotations

from inspect import isawaitable
from typing import Any

from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.configs import to_json
from gateway.api.requests import API_LEVEL, Publish, RawReply, T, above_api_level
from gateway.api.responses import AccountInfoResponse, ApiStats, Route
from gateway.engine.consumer_effects import Listeners
from gateway.handlers import consumers as consumer_api
from gateway.handlers import streams as stream_api
from gateway.handlers.consumers import ConsumerApi, SeqAtTime
from gateway.handlers.streams import StreamApi, usage_of


def split_api_subject(subject: str, prefix: str) -> list[str] | None:
    """The tokens after the API prefix (``$JS.<domain>.API.``), or None when it is not an API call."""
    if not subject.startswith(prefix):
        return None
    return subject[len(prefix) :].split(".")


class Api:
    """Routes a request to the stream or consumer handlers and renders their errors."""

    def __init__(
        self,
        registry: Registry,
        streams: StreamApi,
        seq_at_time: SeqAtTime,
        publish: Publish,
        listeners: Listeners,
        domain: str,
    ) -> None:
        self.reg = registry
        self.domain = domain
        self.streams = streams
        self.consumers = ConsumerApi(registry, seq_at_time, publish, listeners)

    async def handle(
        self, toks: list[str], body: bytes, hdrs: bytes | None = None
    ) -> dict[str, Any] | list[RawReply] | None:
        """Answer one API request; unknown subjects get no answer, as from the real server. A
        request that requires a higher API level than jetlake's is refused before anything else
        is read (a direct get answers that with a status of its own)."""
        op = ".".join(toks[:2])
        try:
            if any(CLUSTERED_ONLY.get(".".join(toks[:n])) == len(toks) for n in (2, 3)):
                raise errors.CLUSTER_REQUIRED
            route = self._route(toks, hdrs)
            if route is None:
                return None
            if toks[0] != "DIRECT" and above_api_level(hdrs):
                raise errors.REQUIRED_API_LEVEL
            if (why := self._offline(toks)) is not None:
                if _operation(toks) in SILENT_WHEN_OFFLINE:
                    return None  # the server lets these time out on an offline stream
                raise errors.STREAM_OFFLINE.format(err=why)
            answer = route(body)
            if isawaitable(answer):
                answer = await answer
            return answer if answer is None or isinstance(answer, list) else to_json(answer)
        except errors.ApiError as err:
            refusal: dict[str, Any] = {"type": T + _response_type(toks), "error": err.render()}
            refusal.update(stream_api.ERROR_EXTRAS.get(op, {}))
            refusal.update(consumer_api.ERROR_EXTRAS.get(op, {}))
            return refusal
        return None

    def _route(self, toks: list[str], hdrs: bytes | None) -> Route | None:
        if toks == ["INFO"]:
            return self.account_info
        if toks[0] in ("STREAM", "DIRECT"):
            return self.streams.route(toks, hdrs)
        if toks[0] == "CONSUMER":
            return self.consumers.route(toks)
        return None

    def _offline(self, toks: list[str]) -> str | None:
        """Why the stream a request names is offline (``Registry.quarantine``), None if it is not."""
        at = STREAM_TOKEN.get(".".join(toks[:2]))
        if at is None or len(toks) <= at or not self.reg.quarantine:
            return None
        return self.reg.quarantine.reason(toks[at])

    async def account_info(self, _body: bytes) -> AccountInfoResponse:
        """``$JS.API.INFO`` (its body is not read, as on the server); per stream, the other
        gateways' usage and API counts gathered and added, as a cluster sums its servers'."""
        usage = usage_of(self.reg)
        if self.streams.others is not None:
            usage += (await self.streams.others()).usage
        return AccountInfoResponse(
            memory=usage.memory,
            storage=usage.storage,
            reserved_memory=usage.reserved_memory,
            reserved_storage=usage.reserved_storage,
            streams=usage.streams,
            consumers=usage.consumers,
            domain=self.domain,
            api=ApiStats(API_LEVEL, usage.api_total, usage.api_errors),
        )


#: Operations only a cluster performs, with the number of tokens their subject has: a single
#: server answers each with 503/10010 whatever the names and the body, and so does jetlake.
CLUSTERED_ONLY = {
    "STREAM.LEADER.STEPDOWN": 4,
    "CONSUMER.LEADER.STEPDOWN": 5,
    "STREAM.PEER.REMOVE": 4,
    "STREAM.PEER.EVACUATE": 4,
    "STREAM.CANCEL_MOVE": 3,
}

#: Where a request's subject names its stream, by its first two tokens.
STREAM_TOKEN = {
    **dict.fromkeys(("STREAM.CREATE", "STREAM.UPDATE", "STREAM.INFO", "STREAM.DELETE", "STREAM.PURGE"), 2),
    **dict.fromkeys(("STREAM.SNAPSHOT", "STREAM.RESTORE", "DIRECT.GET", "CONSUMER.CREATE"), 2),
    **dict.fromkeys(("CONSUMER.INFO", "CONSUMER.DELETE", "CONSUMER.NAMES", "CONSUMER.LIST"), 2),
    **dict.fromkeys(("CONSUMER.PAUSE", "CONSUMER.RESET", "CONSUMER.UNPIN"), 2),
    **dict.fromkeys(("STREAM.MSG", "CONSUMER.DURABLE", "CONSUMER.MSG"), 3),
}

#: What the server lets time out on an offline stream (a read of a message, a pull, a pause or
#: unpin); every other request naming it is answered 500/10194 ``stream is offline: <why>``.
SILENT_WHEN_OFFLINE = {
    "DIRECT.GET",
    "STREAM.MSG.GET",
    "CONSUMER.MSG.NEXT",
    "CONSUMER.PAUSE",
    "CONSUMER.UNPIN",
}


def _operation(toks: list[str]) -> str:
    return ".".join(toks[:3]) if toks[:2] in (["STREAM", "MSG"], ["CONSUMER", "MSG"]) else ".".join(toks[:2])


_RESPONSE_TYPES = {
    "INFO": "account_info_response",
    "STREAM.LEADER.STEPDOWN": "stream_leader_stepdown_response",
    "CONSUMER.LEADER.STEPDOWN": "consumer_leader_stepdown_response",
    "STREAM.PEER.REMOVE": "stream_remove_peer_response",
    "STREAM.PEER.EVACUATE": "stream_evacuate_peer_response",
    "STREAM.CANCEL_MOVE": "stream_cancel_move_response",
    **stream_api.RESPONSE_TYPES,
    **consumer_api.RESPONSE_TYPES,
}


def _response_type(toks: list[str]) -> str:
    for n in (3, 2, 1):
        found = _RESPONSE_TYPES.get(".".join(toks[:n]))
        if found:
            return found
    return "error_response"
