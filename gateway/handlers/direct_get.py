"""Finding messages for MSG.GET and DIRECT.GET, and DIRECT.GET's answers (ADR-31): a message as
headers plus payload, batches and ``multi_last`` closed by a ``204 EOB`` status, the 404/408
statuses, and "no responders" for a stream without ``allow_direct``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.adapters.loader import MessageLoader
from gateway.adapters.registry import Registry
from gateway.api import errors
from gateway.api.consumer_config import parse_time_ns
from gateway.api.pull import REQUIRED_API_LEVEL
from gateway.api.requests import RawReply, above_api_level, load_request
from gateway.api.structs import BOOL, INT, STRING, STRINGS, TIME, UINT, go, request_type
from gateway.api.timefmt import rfc3339
from gateway.engine.stream import Stream
from storage_delta.commit.writer import StoredMessage
from storage_delta.format.nats import no_responders, status_block

NOT_FOUND = RawReply(status_block(404, "Message Not Found"))
NO_RESULTS = RawReply(status_block(404, "No Results"))


@dataclass(frozen=True, slots=True)
class MsgGetRequest:
    """The get request (``JSApiMsgGetRequest``) of MSG.GET and DIRECT.GET."""

    seq: int = go(UINT, 0)
    last_by_subj: str = go(STRING, "")
    next_by_subj: str = go(STRING, "")
    batch: int = go(INT, 0)
    max_bytes: int = go(INT, 0)
    start_time: str = go(TIME, "")
    multi_last: list[str] | None = go(STRINGS, None)
    up_to_seq: int = go(UINT, 0)
    up_to_time: str = go(TIME, "")
    no_hdr: bool = go(BOOL, False)

    def names_a_message(self) -> bool:
        return bool(self.seq or self.last_by_subj or self.next_by_subj or self.multi_last or self.start_time)


#: MSG.GET decodes it strictly, DIRECT.GET ignores unknown fields.
MSG_GET_REQUEST = request_type(MsgGetRequest, "server.JSApiMsgGetRequest")
DIRECT_GET_REQUEST = request_type(MsgGetRequest, "server.JSApiMsgGetRequest", strict=False)


def check_get_request(req: MsgGetRequest) -> None:
    """MSG.GET's refusals of the request itself (10003), made before the stream is looked up: no
    batches in this API, and ``seq``, ``last_by_subj`` and ``start_time`` exclude each other
    (``next_by_subj`` pairs with ``seq`` or ``start_time``), one of them being required."""
    seq, start = req.seq, req.start_time
    last_by, next_by = req.last_by_subj, req.next_by_subj
    if req.batch > 0 or req.max_bytes > 0:
        raise errors.BAD_REQUEST
    if sum(map(bool, (seq, last_by, start))) > 1 or (last_by and next_by):
        raise errors.BAD_REQUEST
    if not (seq or last_by or next_by or start):
        raise errors.BAD_REQUEST


def find_seq(stream: Stream, req: MsgGetRequest) -> int | None:
    """The sequence a get request names (``seq``, ``last_by_subj``, ``next_by_subj`` from ``seq``
    or ``start_time``, ``start_time`` alone: the first message at or after it)."""
    seq, last_by, next_by, start = req.seq, req.last_by_subj, req.next_by_subj, req.start_time
    if last_by and (seq or next_by):
        raise errors.BAD_REQUEST
    if last_by:
        return stream.last_seq_matching(last_by) or None
    if start:
        seq = stream.seq_at_time(parse_time_ns(start))
    if next_by or start:
        return stream.first_seq_at_or_after(seq, [next_by] if next_by else [])
    if not seq:
        raise errors.BAD_REQUEST
    return seq if stream.is_live(seq) else None


def direct_headers(stream: str, msg: StoredMessage, extra: dict[str, str] | None = None) -> bytes:
    """The message's own headers followed by the ones DIRECT.GET adds."""
    lines = {
        "Nats-Stream": stream,
        "Nats-Subject": msg.subject,
        "Nats-Sequence": str(msg.seq),
        "Nats-Time-Stamp": rfc3339(msg.ts),
        **(extra or {}),
    }
    base = msg.hdrs[:-2].decode() if msg.hdrs and msg.hdrs.endswith(b"\r\n\r\n") else "NATS/1.0\r\n"
    return (base + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n").encode()


class DirectGet:
    def __init__(self, registry: Registry, loader: MessageLoader) -> None:
        self.reg = registry
        self.loader = loader

    async def answer(self, name: str, subject: str, body: bytes, hdrs: bytes | None) -> list[RawReply]:
        """The messages to send the requester, in order."""
        stream = self.reg.streams.get(name)
        if stream is None or not stream.config.allow_direct:
            asked = f"DIRECT.GET.{name}.{subject}" if subject else f"DIRECT.GET.{name}"
            return [RawReply(status_block(503, "", no_responders("$JS.API." + asked)))]
        if above_api_level(hdrs):
            return [RawReply(status_block(*REQUIRED_API_LEVEL))]
        if subject:
            req = MsgGetRequest(last_by_subj=subject)
        elif not body.strip():
            return [RawReply(status_block(408, "Empty Request"))]
        else:
            try:
                req = load_request(body, DIRECT_GET_REQUEST)
            except errors.ApiError:
                return [RawReply(status_block(408, "Malformed Request"))]
            if not req.names_a_message():
                return [RawReply(status_block(408, "Empty Request"))]
        if req.multi_last:
            return await self._multi_last(stream, req, req.multi_last)
        try:
            seq = find_seq(stream, req)
        except errors.ApiError:
            return [RawReply(status_block(408, "Bad Request"))]
        if req.batch > 0:
            return await self._batch(stream, seq, req)
        msg = await self.loader.load(stream, seq) if seq else None
        if msg is None:
            return [NOT_FOUND]
        if req.no_hdr:
            return [RawReply(b"", msg.data)]
        return [RawReply(direct_headers(stream.name, msg), msg.data)]

    async def _batch(self, stream: Stream, first: int | None, req: MsgGetRequest) -> list[RawReply]:
        """Up to ``batch`` messages from ``first`` on (matching ``next_by_subj``), stopping once
        ``max_bytes`` are sent; each says how many more match and which one it follows."""
        filters = [req.next_by_subj] if req.next_by_subj else []
        batch, max_bytes = req.batch, req.max_bytes
        seqs: list[int] = []
        seq = first
        while seq is not None and len(seqs) < batch:
            seqs.append(seq)
            seq = stream.first_seq_at_or_after(seq + 1, filters)
        return await self._send(
            stream, seqs, max_bytes, lambda s: stream.count_matching_after(s, filters), {}
        )

    async def _multi_last(self, stream: Stream, req: MsgGetRequest, filters: list[str]) -> list[RawReply]:
        """The newest message of each subject the filters match, at or below ``up_to_seq`` (or
        stored before ``up_to_time``)."""
        upto = req.up_to_seq or stream.state.last_seq
        if req.up_to_time:
            if req.up_to_seq:
                return [RawReply(status_block(408, "Bad Request"))]
            upto = stream.seq_at_time(parse_time_ns(req.up_to_time)) - 1
        seqs = stream.last_per_subject(filters, upto) if upto > 0 else []
        if not seqs:
            return [NO_RESULTS]
        chosen = seqs[: req.batch] if req.batch > 0 else seqs
        return await self._send(
            stream,
            chosen,
            0,
            lambda s: len(seqs) - seqs.index(s) - 1,
            {"Nats-UpTo-Sequence": str(upto)},
        )

    async def _send(
        self,
        stream: Stream,
        seqs: list[int],
        max_bytes: int,
        pending: Callable[[int], int],
        eob_extra: dict[str, str],
    ) -> list[RawReply]:
        out: list[RawReply] = []
        last, sent = 0, 0
        for seq in seqs:
            msg = await self.loader.load(stream, seq)
            if msg is None:
                continue
            extra = {"Nats-Num-Pending": str(pending(seq)), "Nats-Last-Sequence": str(last)}
            out.append(RawReply(direct_headers(stream.name, msg, extra), msg.data))
            last = seq
            sent += len(msg.data) + len(msg.subject) + (len(msg.hdrs) if msg.hdrs else 0)
            if max_bytes and sent >= max_bytes:
                break
        if not out:
            return [NOT_FOUND]
        eob = {"Nats-Num-Pending": str(pending(last)), "Nats-Last-Sequence": str(last), **eob_extra}
        out.append(RawReply(status_block(204, "EOB", eob)))
        return out
