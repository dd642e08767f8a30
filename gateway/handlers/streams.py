"""The stream half of the JetStream API: STREAM.* and DIRECT.GET requests, answered from the live
registry (cold message reads go to Delta on the executor).

Handlers return the response body or raise :class:`~gateway.errors.ApiError`; the router in
:mod:`gateway.api` renders errors and stays silent on subjects nobody handles. Removals (MSG.DELETE,
PURGE) are answered only once the removal log holds them.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, astuple, dataclass, replace
from functools import partial
from itertools import islice
from typing import Any

from gateway.adapters.archives import Archives
from gateway.adapters.loader import MessageLoader
from gateway.adapters.registry import Registry
from gateway.adapters.removals import RemovalRecorder
from gateway.api import advisories, errors, stream_config
from gateway.api.configs import StreamConfig, to_json
from gateway.api.requests import (
    NAMES_PAGE,
    Publish,
    T,
    is_empty_request,
    load_optional_request,
    load_request,
    require_empty_request,
)
from gateway.api.responses import (
    Answer,
    Gateways,
    MsgGetResponse,
    Paged,
    Route,
    StoredMsg,
    StreamCreateResponse,
    StreamInfo,
    StreamInfoResponse,
    StreamPurgeResponse,
    StreamRestoreResponse,
    StreamSnapshotResponse,
    StreamsResponse,
    SuccessResponse,
)
from gateway.api.stream_update import apply_update
from gateway.api.structs import BOOL, INT, STRING, TIME, UINT, UINTS, Struct, go, request_type
from gateway.api.timefmt import now_ns, rfc3339
from gateway.engine.stream import Stream
from gateway.handlers.direct_get import MSG_GET_REQUEST, DirectGet, check_get_request, find_seq
from gateway.runtime.seqwait import SeqWaiters
from storage_delta.commit.writer import WriterClosed
from storage_delta.format.nats import is_valid_subject, subjects_overlap


@dataclass(frozen=True, slots=True)
class Usage:
    """What an account's streams hold and reserve and how many API requests were answered
    (``$JS.API.INFO``), of one gateway or summed: a cluster's INFO sums its servers' counts."""

    memory: int = 0
    storage: int = 0
    reserved_memory: int = 0
    reserved_storage: int = 0
    streams: int = 0
    consumers: int = 0
    api_total: int = 0
    api_errors: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def usage_of(reg: Registry) -> Usage:
    """This gateway's streams' usage and the API requests it answered; offline streams count as
    streams."""
    memory = [s for s in reg.streams.values() if s.config.storage == "memory"]
    files = [s for s in reg.streams.values() if s.config.storage != "memory"]
    return Usage(
        memory=sum(s.state.bytes for s in memory),
        storage=sum(s.state.bytes for s in files),
        # what the streams' max_bytes reserve of the account, as the server reserves it
        reserved_memory=sum(max(s.config.max_bytes, 0) for s in memory),
        reserved_storage=sum(max(s.config.max_bytes, 0) for s in files),
        streams=len(reg.streams) + len(reg.quarantine.streams),
        consumers=sum(len(c) for c in reg.consumers.values()),
        api_total=reg.api_total,
        api_errors=reg.api_errors,
    )


@dataclass(frozen=True, slots=True)
class Others:
    """What the other gateways of the store serve (per-stream ownership, #19), gathered for an
    account-wide answer: their streams as STREAM.LIST renders them, their usage, and the streams
    placed on gateways that did not answer in time (listed as ``missing``, as a cluster lists a
    stream whose leader did not answer)."""

    streams: tuple[Mapping[str, Any], ...] = ()
    usage: Usage = Usage()
    missing: tuple[str, ...] = ()


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
    "STREAM.SNAPSHOT": "stream_snapshot_response",
    "STREAM.RESTORE": "stream_restore_response",
}

#: Fields the real server adds to an error answer of these requests.
ERROR_EXTRAS: dict[str, dict[str, Any]] = {
    "STREAM.NAMES": {"total": 0, "offset": 0, "limit": 0, "streams": None},
    "STREAM.INFO": {"total": 0, "offset": 0, "limit": 0},
    "STREAM.PURGE": {"purged": 0},
    "STREAM.RESTORE": {"deliver_subject": ""},
}

LIST_PAGE = 256
SUBJECT_DETAILS_LIMIT = 100_000


# The requests, as the real server's Go structs (it decodes them strictly).


@dataclass(frozen=True, slots=True)
class StreamNamesRequest:
    offset: int = go(INT, 0)
    subject: str = go(STRING, "")  # only streams with a subject that overlaps it


@dataclass(frozen=True, slots=True)
class StreamInfoRequest:
    offset: int = go(INT, 0)
    deleted_details: bool = go(BOOL, False)
    subjects_filter: str = go(STRING, "")


@dataclass(frozen=True, slots=True)
class StreamPurgeRequest:
    filter: str = go(STRING, "")
    seq: int = go(UINT, 0)
    keep: int = go(UINT, 0)


@dataclass(frozen=True, slots=True)
class MsgDeleteRequest:
    seq: int = go(UINT, 0)
    no_erase: bool = go(BOOL, False)


@dataclass(frozen=True, slots=True)
class StreamSnapshotRequest:
    deliver_subject: str = go(STRING, "")
    no_consumers: bool = go(BOOL, False)
    chunk_size: int = go(INT, 0)
    window_size: int = go(INT, 0)
    jsck: bool = go(BOOL, False)


#: A restore request: the config as the server's StreamConfig (a create's without ``pedantic``)
#: and the stream state it announces (a subject map's members are not checked).
RESTORE_REQUEST = Struct(
    "server.JSApiStreamRestoreRequest",
    {
        "config": Struct(
            "server.StreamConfig",
            {k: v for k, v in (stream_config.REQUEST.fields or {}).items() if k != "pedantic"},
        ),
        "state": Struct(
            "server.StreamState",
            {
                "messages": UINT,
                "bytes": UINT,
                "first_seq": UINT,
                "first_ts": TIME,
                "last_seq": UINT,
                "last_ts": TIME,
                "num_subjects": INT,
                "subjects": Struct("map[string]uint64"),
                "num_deleted": INT,
                "deleted": UINTS,
                "lost": Struct("server.LostStreamData", {"msgs": UINTS, "bytes": UINT}),
                "consumer_count": INT,
            },
        ),
    },
)

#: What a restore of a mirror or a stream with sources is refused with, at once.
NO_COPY_RESTORE = "jetlake does not restore a mirror or a stream with sources"

NAMES_REQUEST = request_type(StreamNamesRequest, "server.JSApiStreamNamesRequest")
LIST_REQUEST = request_type(StreamNamesRequest, "server.JSApiStreamListRequest")
INFO_REQUEST = request_type(StreamInfoRequest, "server.JSApiStreamInfoRequest")
PURGE_REQUEST = request_type(StreamPurgeRequest, "server.JSApiStreamPurgeRequest")
MSG_DELETE_REQUEST = request_type(MsgDeleteRequest, "server.JSApiMsgDeleteRequest")
SNAPSHOT_REQUEST = request_type(StreamSnapshotRequest, "server.JSApiStreamSnapshotRequest")


class StreamApi:
    def __init__(
        self,
        registry: Registry,
        loader: MessageLoader,
        recorder: RemovalRecorder,
        publish: Publish,
        domain: str,
        archives: Archives,
        storing: Callable[[], bool] = lambda: True,
        origins: Callable[[Stream], tuple[dict[str, Any] | None, list[dict[str, Any]] | None]] = lambda _: (
            None,
            None,
        ),
        gateways: Callable[[], Gateways] = lambda: Gateways("jetlake"),
    ) -> None:
        #: Whether the commit loop runs: a rollback while it does not (it died) leaves unknown
        #: whether the commit in flight landed, so a removal waiting for it fails.
        self._storing = storing
        #: A stream's mirror and sources as its info shows them (``Sourcing.info``).
        self._origins = origins
        #: The live gateways of the store (``Ownership.gateways``): the streams' ``cluster``, and
        #: how many replicas can be placed.
        self._gateways = gateways
        #: Per-stream ownership: the other gateways' streams and usage, gathered (set by the
        #: gateway; None: this gateway serves the whole store).
        self.others: Callable[[], Awaitable[Others]] | None = None
        self.reg = registry
        self.loader = loader
        self.recorder = recorder
        self.publish = publish
        self.domain = domain
        self.archives = archives
        self.direct = DirectGet(registry, loader)
        self._waiting: dict[Stream, SeqWaiters] = {}  # removals waiting for a commit, by stream
        self._listening: dict[Stream, Callable[[], None]] = {}  # their durable_moved listeners

    def route(self, toks: list[str], hdrs: bytes | None) -> Route | None:
        """The handler of a stream (or direct get) subject; None for a subject nobody answers.
        A direct get reads the request's headers itself: it refuses a required API level with a
        status, and only where a stream serves direct gets."""
        op = ".".join(toks[:2])
        if toks[0] == "DIRECT" and len(toks) >= 3 and toks[1] == "GET":
            return partial(self.direct.answer, toks[2], ".".join(toks[3:]), hdrs=hdrs)
        if op in ("STREAM.NAMES", "STREAM.LIST") and len(toks) == 2:
            return partial(self.stream_list, names_only=op == "STREAM.NAMES")
        if len(toks) == 3:
            by_stream: dict[str, Callable[[str, bytes], Awaitable[Answer]]] = {
                "STREAM.CREATE": self.stream_create,
                "STREAM.UPDATE": self.stream_update,
                "STREAM.INFO": self.stream_info,
                "STREAM.DELETE": self.stream_delete,
                "STREAM.PURGE": self.stream_purge,
                "STREAM.SNAPSHOT": self.stream_snapshot,
                "STREAM.RESTORE": self.stream_restore,
            }
            handler = by_stream.get(op)
            if handler is not None:
                return partial(handler, toks[2])
        if op == "STREAM.MSG" and len(toks) == 4 and toks[2] == "GET":
            return partial(self.msg_get, toks[3])
        if op == "STREAM.MSG" and len(toks) == 4 and toks[2] == "DELETE":
            return partial(self.msg_delete, toks[3])
        return None

    def _stream(self, name: str) -> Stream:
        return self.reg.stream(name)

    # ---- definitions ------------------------------------------------------------------------------

    def _check_overlap(self, cfg: StreamConfig) -> None:
        """Against the live streams' subjects and those of other streams being committed."""
        index, live = self.reg.subject_index, self.reg.streams
        for subject in cfg.subjects:
            if any(name != cfg.name and name in live for name in index.overlapping(subject)):
                raise errors.STREAM_SUBJECT_OVERLAP
        for other in self.reg.in_flight.values():
            if other.name != cfg.name and any(
                subjects_overlap(mine, theirs) for mine in cfg.subjects for theirs in other.subjects
            ):
                raise errors.STREAM_SUBJECT_OVERLAP

    async def _check_overlap_elsewhere(self, cfg: StreamConfig) -> None:
        """Per-stream ownership: against the streams the other gateways serve (gathered), as a
        cluster checks a create against every stream of the account. With no other live gateway
        nothing is gathered, so the gathering's account of this gateway's own placements (which
        grows with the streams: 1.5 ms a create at 2,000, #23) is not built for nothing."""
        if self.others is None or not self._gateways().standbys:
            return
        for info in (await self.others()).streams:
            config = info["config"]
            if config["name"] != cfg.name and any(
                subjects_overlap(mine, theirs)
                for mine in cfg.subjects
                for theirs in config.get("subjects", ())
            ):
                raise errors.STREAM_SUBJECT_OVERLAP

    def _check_placement(self, replicas: int) -> None:
        """A stream of R > 1 is placed when R gateways are live (the owner and R - 1 standbys), as
        a cluster places R peers or answers 10005: that many could serve it after the owner dies."""
        if replicas > 1 + len(self._gateways().standbys):
            raise errors.NO_SUITABLE_PEERS

    async def _with_origins(self, cfg: StreamConfig) -> StreamConfig:
        """What the server checks of the origins of a mirror or sources that exist: a copy must
        take messages as large as its origin's; a mirror serves direct gets as its origin does;
        no cycle (:meth:`_check_source_cycle`). Per stream (#19) an origin another gateway serves
        is looked up among the gathered streams, as a cluster checks against the whole account."""
        find = self._config_finder()
        for src in [cfg.mirror] if cfg.mirror else list(cfg.sources):
            origin = await find(src["name"])
            limit = int(origin.get("max_msg_size") or 0) if origin is not None else 0
            if 0 < cfg.max_msg_size < limit:
                raise (
                    errors.MIRROR_MAX_MESSAGE_SIZE_TOO_BIG
                    if cfg.mirror
                    else errors.SOURCE_MAX_MESSAGE_SIZE_TOO_BIG
                )
        await self._check_source_cycle(cfg, find)
        mirrored = await find(cfg.mirror["name"]) if cfg.mirror else None
        if mirrored is not None:
            cfg = replace(cfg, mirror_direct=bool(mirrored.get("allow_direct")))
        return cfg

    def _config_finder(self) -> Callable[[str], Awaitable[Mapping[str, Any] | None]]:
        """A stream's config as rendered (``to_json``) by name: this gateway's, else (per stream)
        the other gateways' as they render it, gathered once, and only when a name is not here."""
        gathered: dict[str, Mapping[str, Any]] | None = None

        async def find(name: str) -> Mapping[str, Any] | None:
            nonlocal gathered
            local = self.reg.stream_config(name)
            if local is not None:
                return to_json(local)
            if self.others is None:
                return None
            if gathered is None:
                gathered = {str(i["config"]["name"]): i["config"] for i in (await self.others()).streams}
            return gathered.get(name)

        return find

    async def _check_source_cycle(
        self, cfg: StreamConfig, find: Callable[[str], Awaitable[Mapping[str, Any] | None]]
    ) -> None:
        """The server's cycle check: walking the sources from this stream, a stream met again whose
        subjects the source's filter overlaps would copy its own messages back."""
        to_visit: list[Mapping[str, Any]] = [to_json(cfg)]
        visited: set[str] = set()
        while to_visit:
            current = to_visit.pop(0)
            visited.add(current["name"])
            for src in current.get("sources") or ():
                if src.get("external"):
                    continue
                if src["name"] in visited:
                    only = src.get("filter_subject") or ""
                    subjects = current.get("subjects") or ()
                    if not only or any(subjects_overlap(subject, only) for subject in subjects):
                        raise errors.STREAM_INVALID_CONFIG.format(err="detected cycle")
                elif (other := await find(src["name"])) is not None:
                    to_visit.append(other)

    async def stream_create(self, name: str, body: bytes) -> StreamCreateResponse:
        req = load_request(body, stream_config.REQUEST)
        if req.get("name") != name:
            raise errors.STREAM_MISMATCH
        req["name"] = name
        stream_config.check_create(req)
        cfg = await self._with_origins(stream_config.normalize(req, self.reg.server_version))
        existing = self.reg.streams.get(name)
        if existing is None:
            # per-stream ownership: owner first; a stream another gateway created comes with it
            async with self.reg.claimed(name):
                existing = self.reg.streams.get(name)
                stream = existing if existing is not None else await self._create(cfg)
        if existing is not None:
            if not stream_config.same_config(existing.config, cfg):
                raise errors.STREAM_NAME_EXISTS
            stream = existing
        return StreamCreateResponse(info=self._info(stream, with_domain=False), did_create=True)

    async def _create(self, cfg: StreamConfig) -> Stream:
        """A stream that exists nowhere, made of ``cfg`` if no other stream's subjects overlap
        its own and its replicas can be placed."""
        self._check_overlap(cfg)
        await self._check_overlap_elsewhere(cfg)
        self._check_placement(cfg.num_replicas)
        stream = await self.reg.add_stream(cfg, now_ns())
        self.publish(advisories.stream_action(cfg.name, "create", now_ns()))
        return stream

    async def stream_update(self, name: str, body: bytes) -> StreamCreateResponse:
        # As the server: the whole config is checked (a name is required) before it is compared
        # with the subject's and before the stream is looked up.
        req = await self._with_origins(
            stream_config.normalize(load_request(body, stream_config.REQUEST), self.reg.server_version)
        )
        if req.name != name:
            raise errors.STREAM_MISMATCH
        stream = self._stream(name)
        cfg = apply_update(stream.config, req)
        self._check_overlap(cfg)
        if cfg.subjects != stream.config.subjects:
            await self._check_overlap_elsewhere(cfg)
        if cfg.num_replicas > stream.config.num_replicas:  # a scale-up is placed anew
            self._check_placement(cfg.num_replicas)
        await self.reg.update_stream(stream, cfg)
        stream.enforce_limits(now_ns())  # a lowered limit applies at once
        self.recorder.changed(stream)  # its delete markers, and MaxAge timed anew
        self.publish(advisories.stream_action(name, "modify", now_ns()))
        return StreamCreateResponse(type=T + "stream_update_response", info=self._info(stream))

    async def stream_delete(self, name: str, body: bytes) -> SuccessResponse:
        require_empty_request(body)
        await self.reg.remove_stream(self._stream(name))
        self.publish(advisories.stream_action(name, "delete", now_ns()))
        return SuccessResponse(type=T + "stream_delete_response")

    async def stream_list(self, body: bytes, names_only: bool) -> StreamsResponse:
        """Streams by name; an offline stream (``Registry.quarantine``) is named by NAMES and, in
        LIST, counted and named under ``missing`` and ``offline`` as the server lists its offline
        streams. Its config is not known, so a subject filter leaves it out. Per stream, the other
        gateways' streams are gathered (:attr:`others`) and listed as they rendered them; a
        stream whose gateway did not answer is named and, in LIST, under ``missing``."""
        req = load_optional_request(body, NAMES_REQUEST if names_only else LIST_REQUEST)
        subject = req.subject
        others = await self.others() if self.others is not None else Others()
        served = [
            s.name
            for s in self.reg.streams.values()
            if not subject or any(subjects_overlap(subject, x) for x in s.subjects)
        ]
        remote = {
            str(info["config"]["name"]): info
            for info in others.streams
            if info["config"]["name"] not in self.reg.streams
            and (not subject or any(subjects_overlap(subject, x) for x in info["config"].get("subjects", ())))
        }
        unanswered = () if subject else others.missing
        offline = {} if subject else self.reg.quarantine.streams
        names = sorted({*served, *remote, *offline, *unanswered})
        offset = min(max(0, req.offset), len(names))
        if names_only:
            page = tuple(names[offset : offset + NAMES_PAGE])
            paged = Paged(len(names), offset, NAMES_PAGE)
            return StreamsResponse(type=T + "stream_names_response", paged=paged, streams=page or None)
        rest = names[offset:]
        missing = tuple(n for n in rest if n in offline or n in unanswered)
        # Only the page is described: a whole listing is one page per request, not the rest of it.
        on_page = islice((n for n in rest if n not in missing), LIST_PAGE)
        listed = tuple(remote[n] if n in remote else self._listed(self.reg.streams[n]) for n in on_page)
        paged = Paged(len(names), offset, LIST_PAGE)
        return StreamsResponse(
            type=T + "stream_list_response",
            paged=paged,
            streams=listed,
            missing=missing,
            offline={n: offline[n] for n in missing if n in offline},
        )

    def summary(self) -> dict[str, Any]:
        """This gateway's part of an account-wide answer (per-stream ownership): its streams as
        STREAM.LIST renders them, and its usage, for the meta owner's gathering."""
        return {
            "streams": [to_json(self._listed(s)) for s in self.reg.streams.values()],
            "usage": asdict(usage_of(self.reg)),
        }

    def _listed(self, stream: Stream) -> StreamInfo:
        """A stream as STREAM.LIST shows it (its config as :func:`_as_listed`)."""
        return replace(self._info(stream), config=_as_listed(stream.config))

    async def stream_info(self, name: str, body: bytes) -> StreamInfoResponse:
        req = load_optional_request(body, INFO_REQUEST)
        stream = self._stream(name)
        consumers = len(self.reg.listed_consumers(stream.name))
        state = stream.info_state(consumers, req.subjects_filter or None, req.deleted_details)
        paged = Paged()
        if "subjects" in state:
            paged = Paged(len(state["subjects"]), req.offset, SUBJECT_DETAILS_LIMIT)
        return StreamInfoResponse(paged=paged, info=self._info(stream, state))

    def _info(
        self, stream: Stream, state: dict[str, Any] | None = None, with_domain: bool = True
    ) -> StreamInfo:
        """The info of INFO, UPDATE and LIST, which name the server's domain; CREATE's does not."""
        mirror, sources = self._origins(stream)
        return StreamInfo(
            config=stream.config,
            created=rfc3339(stream.created_ns),
            state=state or stream.info_state(len(self.reg.listed_consumers(stream.name))),
            domain=self.domain if with_domain else "",
            cluster=self._gateways().cluster(self.domain, stream.config.num_replicas),
            mirror=mirror,
            sources=sources,
            ts=rfc3339(now_ns()),
        )

    # ---- removals -------------------------------------------------------------------------------

    def _removable(self, name: str, deny: str, refusal: errors.ApiError) -> Stream:
        """The stream a delete or purge acts on, unless it is sealed or denies the request."""
        stream = self._stream(name)
        if stream.config.sealed:
            raise errors.STREAM_SEALED
        if getattr(stream.config, deny):
            raise refusal
        return stream

    async def _record(self, stream: Stream, upto: int) -> None:
        """Make a removal durable before it is answered. A removed message whose own commit is
        still in flight is recorded once that commit lands (or rolls back), so a crash can never
        bring back a message whose removal was acknowledged."""
        if stream.durable_last_seq < upto <= stream.state.last_seq:
            await self._durable(stream, upto)
        await self.recorder.flush()

    def _durable(self, stream: Stream, upto: int) -> asyncio.Future[None]:
        """A future resolved once ``upto`` is durable, or need not be: its commit failed and the
        stream rolled back (the message never was), or the stream was deleted. It fails with
        :class:`~storage_delta.commit.writer.WriterClosed` when the commit loop died: whether the
        message landed is then unknown, and a removal must not be acknowledged without its record.
        The stream tells of each change (``durable_moved``), so nothing polls; this listens only
        while a removal waits."""
        waiters = self._waiting.get(stream)
        if waiters is None:
            waiters = self._waiting[stream] = SeqWaiters()
            self._listening[stream] = stream.durable_moved.connect(partial(self._durable_moved, stream))
        return waiters.wait(upto)

    def _durable_moved(self, stream: Stream) -> None:
        waiters = self._waiting[stream]
        waiters.reached(stream.durable_last_seq)
        if waiters and (stream.ended or stream.state.last_seq <= stream.durable_last_seq):
            # nothing above the durable sequence is in flight any more: rolled back, or deleted
            if stream.ended or self._storing():
                waiters.release()
            else:
                waiters.fail(WriterClosed("the commit loop ended; the message's commit is unknown"))
        if not waiters:
            del self._waiting[stream]
            self._listening.pop(stream)()

    async def stream_purge(self, name: str, body: bytes) -> StreamPurgeResponse:
        req = load_optional_request(body, PURGE_REQUEST)
        stream = self._removable(name, "deny_purge", errors.STREAM_PURGE_NOT_PERMITTED)
        if req.seq and req.keep:
            raise errors.BAD_REQUEST
        upto = stream.state.last_seq
        purged = stream.purge(req.filter or None, req.seq or None, req.keep or None)
        await self._record(stream, upto)
        return StreamPurgeResponse(purged=purged)

    async def msg_delete(self, name: str, body: bytes) -> SuccessResponse:
        if is_empty_request(body):  # refused before the stream is looked up
            raise errors.BAD_REQUEST
        req = load_request(body, MSG_DELETE_REQUEST)
        refusal = errors.STREAM_MSG_DELETE_FAILED.format(err="message delete not permitted")
        stream = self._removable(name, "deny_delete", refusal)
        seq = req.seq
        if not stream.remove(seq):
            st = stream.state
            if seq > st.last_seq:
                raise errors.STREAM_MSG_DELETE_FAILED.format(err="stream store EOF")
            if seq < st.first_seq or not seq:
                raise errors.STREAM_MSG_DELETE_FAILED.format(err="no message found")
            raise errors.SEQUENCE_NOT_FOUND.format(seq=seq)
        # ``no_erase: false`` asks the file store to overwrite the bytes; here the removal log
        # hides the message at once and Spark's retention job removes it from storage.
        await self._record(stream, seq)
        return SuccessResponse(type=T + "stream_msg_delete_response")

    # ---- snapshot and restore ---------------------------------------------------------------------

    async def stream_snapshot(self, name: str, body: bytes) -> StreamSnapshotResponse:
        """``STREAM.SNAPSHOT``: the server's checks in its order, then the stream's config and state;
        its archive (jetlake's own, ``storage_delta.format.archive``) follows on ``deliver_subject``
        (:class:`~gateway.adapters.archives.Archives`)."""
        if is_empty_request(body):
            raise errors.BAD_REQUEST
        stream = self._stream(name)
        req = load_request(body, SNAPSHOT_REQUEST)
        if not is_valid_subject(req.deliver_subject, allow_wildcards=False):
            raise errors.SNAPSHOT_DELIVER_SUBJECT_INVALID
        if stream.durable_last_seq < stream.state.last_seq:  # the archive holds what it announces
            await self._durable(stream, stream.state.last_seq)
        state = self.archives.snapshot(
            stream, req.deliver_subject, req.no_consumers, req.chunk_size, req.window_size
        )
        return StreamSnapshotResponse(config=_as_listed(stream.config), state=state)

    async def stream_restore(self, name: str, body: bytes) -> StreamRestoreResponse:
        """``STREAM.RESTORE``: the server's checks in its order (the config as a create's), then
        the subject to send the archive's chunks to (:class:`~gateway.adapters.archives.Archives`)."""
        if is_empty_request(body):
            raise errors.BAD_REQUEST
        req = load_request(body, RESTORE_REQUEST).get("config", {})
        req["name"] = req.get("name") or name
        if req["name"] != name:
            raise errors.STREAM_MISMATCH
        if "/" in name or "\\" in name:
            raise errors.STREAM_NAME_PATH_SEPARATORS
        cfg = await self._with_origins(stream_config.normalize(req, self.reg.server_version))
        if name in self.reg.streams:
            raise errors.STREAM_NAME_EXIST_RESTORE_FAILED
        self._check_overlap(cfg)
        if cfg.mirror or cfg.sources:
            # a copy's position lives in the commits that stored its rows (DESIGN); an archive
            # has none, so the copy would start again from its origin's first message
            raise errors.STREAM_RESTORE_FAILED.format(err=NO_COPY_RESTORE)
        return StreamRestoreResponse(deliver_subject=self.archives.restore(cfg))

    # ---- reading messages -----------------------------------------------------------------------

    async def msg_get(self, name: str, body: bytes) -> MsgGetResponse:
        req = load_request(body, MSG_GET_REQUEST)
        check_get_request(req)  # before the stream is looked up
        stream = self._stream(name)
        seq = find_seq(stream, req)
        msg = await self.loader.load(stream, seq) if seq else None
        if msg is None:
            raise errors.NO_MESSAGE_FOUND
        return MsgGetResponse(
            message=StoredMsg(
                subject=msg.subject,
                seq=msg.seq,
                hdrs=base64.b64encode(msg.hdrs).decode() if msg.hdrs else "",
                data=base64.b64encode(msg.data).decode(),
                time=rfc3339(msg.ts),
            )
        )


def _as_listed(config: StreamConfig) -> StreamConfig:
    """A config as STREAM.LIST and STREAM.SNAPSHOT show it: the server's own metadata keys left
    out but the level the request asked for."""
    meta = {k: v for k, v in config.metadata.items() if k not in ("_nats.level", "_nats.ver")}
    return replace(config, metadata=meta)
