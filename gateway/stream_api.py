"""The stream half of the JetStream API: STREAM.* and DIRECT.GET requests, answered from the live
registry (cold message reads go to Delta on the executor).

Handlers return the response body or raise :class:`~gateway.errors.ApiError`; the router in
:mod:`gateway.api` renders errors and stays silent on subjects nobody handles. Removals (MSG.DELETE,
PURGE) are answered only once the removal log holds them.
"""

from __future__ import annotations

import base64
from typing import Any

from gateway import errors, stream_config
from gateway.apicommon import NAMES_PAGE, RawReply, T, load_request
from gateway.headers import status_block
from gateway.loader import MessageLoader
from gateway.registry import Registry
from gateway.removals import RemovalRecorder
from gateway.stream import Stream
from gateway.stream_update import apply_update
from gateway.subjects import subjects_overlap
from gateway.timefmt import now_ns, rfc3339
from storage_delta.writer import StoredMessage

RESPONSE_TYPES = {
    "STREAM.CREATE": "stream_create_response",
    "STREAM.UPDATE": "stream_update_response",
    "STREAM.INFO": "stream_info_response",
    "STREAM.DELETE": "stream_delete_response",
    "STREAM.NAMES": "stream_names_response",
    "STREAM.LIST": "stream_list_response",
    "STREAM.PURGE": "stream_purge_response",
    "STREAM.MSG.GET": "stream_msg_get_response",
    "STREAM.MSG.DELETE": "stream_msg_delete_response",
}

#: Fields the real server adds to an error answer of these requests.
ERROR_EXTRAS: dict[str, dict[str, Any]] = {
    "STREAM.NAMES": {"total": 0, "offset": 0, "limit": 0, "streams": None},
    "STREAM.INFO": {"total": 0, "offset": 0, "limit": 0},
    "STREAM.PURGE": {"purged": 0},
}

LIST_PAGE = 256
SUBJECT_DETAILS_LIMIT = 100_000
#: What a requester sees when nobody listens: the server's "no responders" status.
NO_RESPONDERS = RawReply(status_block(503, ""))


class StreamApi:
    def __init__(self, registry: Registry, loader: MessageLoader, recorder: RemovalRecorder) -> None:
        self.reg = registry
        self.loader = loader
        self.recorder = recorder

    async def handle(self, toks: list[str], body: bytes) -> dict[str, Any] | RawReply | None:
        op = ".".join(toks[:2])
        if toks[0] == "DIRECT" and len(toks) >= 3 and toks[1] == "GET":
            return await self.direct_get(toks[2], ".".join(toks[3:]), body)
        if op in ("STREAM.NAMES", "STREAM.LIST") and len(toks) == 2:
            return self.stream_list(body, names_only=op == "STREAM.NAMES")
        if len(toks) == 3:
            handler = {
                "STREAM.CREATE": self.stream_create,
                "STREAM.UPDATE": self.stream_update,
                "STREAM.INFO": self.stream_info,
                "STREAM.DELETE": self.stream_delete,
                "STREAM.PURGE": self.stream_purge,
            }.get(op)
            if handler is not None:
                return await handler(toks[2], body)
        if op == "STREAM.MSG" and len(toks) == 4 and toks[2] in ("GET", "DELETE"):
            if toks[2] == "GET":
                return await self.msg_get(toks[3], body)
            return await self.msg_delete(toks[3], body)
        return None

    def _stream(self, name: str) -> Stream:
        stream = self.reg.streams.get(name)
        if stream is None:
            raise errors.STREAM_NOT_FOUND
        return stream

    # ---- definitions ------------------------------------------------------------------------------

    def _check_overlap(self, cfg: dict[str, Any]) -> None:
        for other in self.reg.streams.values():
            if other.name != cfg["name"] and any(
                subjects_overlap(a, b) for a in cfg["subjects"] for b in other.subjects
            ):
                raise errors.STREAM_SUBJECT_OVERLAP

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
            self._check_overlap(cfg)
            stream = await self.reg.add_stream(cfg, now_ns())
        return {
            "type": T + "stream_create_response",
            **self._stream_body(stream),
            "did_create": True,
        }

    async def stream_update(self, name: str, body: bytes) -> dict[str, Any]:
        raw = load_request(body)
        if not raw:
            raise errors.STREAM_INVALID_CONFIG.format(
                err="stream name is required and can not contain '.', '*', '>', '\\', '/'"
            )
        if raw.get("name", name) != name:
            raise errors.STREAM_MISMATCH
        stream = self._stream(name)
        raw["name"] = name
        cfg = apply_update(stream.config, stream_config.normalize(raw, self.reg.server_version))
        self._check_overlap(cfg)
        await self.reg.update_stream(stream, cfg)
        stream.enforce_limits(now_ns())  # a lowered limit applies at once
        return {"type": T + "stream_update_response", **self._stream_body(stream)}

    async def stream_delete(self, name: str, body: bytes) -> dict[str, Any]:
        await self.reg.remove_stream(self._stream(name))
        return {"type": T + "stream_delete_response", "success": True}

    def stream_list(self, body: bytes, names_only: bool) -> dict[str, Any]:
        req = load_request(body)
        subject = req.get("subject") or ""
        streams = sorted(
            (
                s
                for s in self.reg.streams.values()
                if not subject or any(subjects_overlap(subject, x) for x in s.subjects)
            ),
            key=lambda s: s.name,
        )
        offset = min(max(0, int(req.get("offset") or 0)), len(streams))
        if names_only:
            page = [s.name for s in streams[offset : offset + NAMES_PAGE]]
            return {
                "type": T + "stream_names_response",
                "total": len(streams),
                "offset": offset,
                "limit": NAMES_PAGE,
                "streams": page or None,
            }
        return {
            "type": T + "stream_list_response",
            "total": len(streams),
            "offset": offset,
            "limit": LIST_PAGE,
            "streams": [self._listed(s) for s in streams[offset : offset + LIST_PAGE]],
        }

    def _listed(self, stream: Stream) -> dict[str, Any]:
        """A stream as STREAM.LIST shows it: the server's own metadata keys left out but the level
        the request asked for."""
        body = self._stream_body(stream)
        meta = {
            k: v
            for k, v in stream.config.get("metadata", {}).items()
            if k not in ("_nats.level", "_nats.ver")
        }
        return {**body, "config": {**stream.config, "metadata": meta}}

    async def stream_info(self, name: str, body: bytes) -> dict[str, Any]:
        req = load_request(body)
        stream = self._stream(name)
        subjects_filter = req.get("subjects_filter") or None
        offset = int(req.get("offset") or 0)
        state = stream.info_state(
            len(self.reg.consumers.get(stream.name, {})), subjects_filter, bool(req.get("deleted_details"))
        )
        paging = {"total": 0, "offset": 0, "limit": 0}
        if "subjects" in state:
            paging = {"total": len(state["subjects"]), "offset": offset, "limit": SUBJECT_DETAILS_LIMIT}
        return {"type": T + "stream_info_response", **paging, **self._stream_body(stream, state)}

    def _stream_body(self, stream: Stream, state: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "config": stream.config,
            "created": rfc3339(stream.created_ns),
            "state": state or stream.info_state(len(self.reg.consumers.get(stream.name, {}))),
            "ts": rfc3339(now_ns()),
        }

    # ---- removals -------------------------------------------------------------------------------

    async def stream_purge(self, name: str, body: bytes) -> dict[str, Any]:
        req = load_request(body)
        stream = self._stream(name)
        if stream.config.get("sealed"):
            raise errors.STREAM_SEALED
        if stream.config.get("deny_purge"):
            raise errors.STREAM_PURGE_NOT_PERMITTED
        seq, keep = int(req.get("seq") or 0), int(req.get("keep") or 0)
        if seq and keep:
            raise errors.BAD_REQUEST
        purged = stream.purge(req.get("filter") or None, seq or None, keep or None)
        await self.recorder.flush()
        return {"type": T + "stream_purge_response", "success": True, "purged": purged}

    async def msg_delete(self, name: str, body: bytes) -> dict[str, Any]:
        req = load_request(body)
        stream = self._stream(name)
        if stream.config.get("sealed"):
            raise errors.STREAM_SEALED
        if stream.config.get("deny_delete"):
            raise errors.STREAM_MSG_DELETE_FAILED.format(err="message delete not permitted")
        seq = int(req.get("seq") or 0)
        if seq <= 0:
            raise errors.BAD_REQUEST
        if not stream.remove(seq):
            st = stream.state
            if seq > st.last_seq:
                raise errors.STREAM_MSG_DELETE_FAILED.format(err="stream store EOF")
            if seq < st.first_seq:
                raise errors.STREAM_MSG_DELETE_FAILED.format(err="no message found")
            raise errors.SEQUENCE_NOT_FOUND.format(seq=seq)
        # ``no_erase: false`` asks the file store to overwrite the bytes; here the removal log
        # hides the message at once and Spark's retention job removes it from storage.
        await self.recorder.flush()
        return {"type": T + "stream_msg_delete_response", "success": True}

    # ---- reading messages -----------------------------------------------------------------------

    def _find(self, stream: Stream, req: dict[str, Any]) -> int | None:
        """The sequence a get request names (``seq``, ``last_by_subj``, ``next_by_subj`` + ``seq``)."""
        seq = int(req.get("seq") or 0)
        last_by, next_by = req.get("last_by_subj"), req.get("next_by_subj")
        if last_by and (seq or next_by):
            raise errors.BAD_REQUEST
        if last_by:
            return stream.last_seq_matching(str(last_by)) or None
        if next_by:
            return stream.first_seq_at_or_after(seq, [str(next_by)])
        if not seq:
            raise errors.BAD_REQUEST
        return seq if stream.is_live(seq) else None

    async def msg_get(self, name: str, body: bytes) -> dict[str, Any]:
        req = load_request(body)
        stream = self._stream(name)
        seq = self._find(stream, req)
        msg = await self.loader.load(stream, seq) if seq else None
        if msg is None:
            raise errors.NO_MESSAGE_FOUND
        out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.hdrs:
            out["hdrs"] = base64.b64encode(msg.hdrs).decode()
        if msg.data:
            out["data"] = base64.b64encode(msg.data).decode()
        out["time"] = rfc3339(msg.ts)
        return {"type": T + "stream_msg_get_response", "message": out}

    async def direct_get(self, name: str, subject: str, body: bytes) -> RawReply:
        """DIRECT.GET: the message as headers and payload; the server's 404/408 statuses; a stream
        without ``allow_direct`` (or none) looks as if nobody listened."""
        stream = self.reg.streams.get(name)
        if stream is None or not stream.config.get("allow_direct"):
            return NO_RESPONDERS
        if subject:
            req: dict[str, Any] = {"last_by_subj": subject}
        elif not body.strip():
            return RawReply(status_block(408, "Empty Request"))
        else:
            try:
                req = load_request(body)
            except errors.ApiError:
                return RawReply(status_block(408, "Malformed Request"))
        try:
            seq = self._find(stream, req)
        except errors.ApiError:
            return RawReply(status_block(408, "Bad Request"))
        msg = await self.loader.load(stream, seq) if seq else None
        if msg is None:
            return RawReply(status_block(404, "Message Not Found"))
        return RawReply(direct_headers(stream.name, msg), msg.data)


def direct_headers(stream: str, msg: StoredMessage) -> bytes:
    """The message's own headers followed by the ones DIRECT.GET adds."""
    extra = (
        f"Nats-Stream: {stream}\r\nNats-Subject: {msg.subject}\r\n"
        f"Nats-Sequence: {msg.seq}\r\nNats-Time-Stamp: {rfc3339(msg.ts)}\r\n\r\n"
    )
    base = msg.hdrs[:-2].decode() if msg.hdrs and msg.hdrs.endswith(b"\r\n\r\n") else "NATS/1.0\r\n"
    return (base + extra).encode()
