"""The one ordered dispatcher: everything the leaf link reads (publishes, API requests, pull
requests, acks, flow-control replies) enters here, in the order the link read it.

Order is the contract (docs/architecture.md): a stream changes in wire order, so what a message sees
or changes comes after everything read before it. Publishes are taken in runs and acks in runs for
speed (``PublishPath.accept_queued``, ``Delivery.apply_acks``), so before any other kind of message
the runs read so far are applied first. API requests are answered after the publishes read before
them were accepted, in lanes (#23): the requests naming a stream in the lane of that stream, in
order among themselves, while other streams' lanes run meanwhile, so that their catalog changes
share group commits. A request that names no stream (``INFO``, ``STREAM.NAMES``, …) is a barrier:
it runs once every request read before it is answered, alone, and those read after it wait for it.
At most ``API_QUEUE_SIZE`` requests wait or run; beyond it a request is dropped and counted (the
client's request times out, as when a server is overloaded), never queued without bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from gateway.adapters.archives import PREFIX as ARCHIVE_PREFIX
from gateway.adapters.archives import Archives
from gateway.adapters.delivery import Delivery
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.sourcing import LINK_PREFIX, Sourcing
from gateway.handlers.router import STREAM_TOKEN, Api, split_api_subject
from gateway.service.gathering import PREFIX as GATHERING_PREFIX
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg

log = logging.getLogger(__name__)

#: API requests waiting or running; beyond it a request is dropped (``LinkDispatcher.api_dropped``).
API_QUEUE_SIZE = 4096

AckRun = list[tuple[bytes, bytes, bytes, bytes]]
#: An API request as read: the subject's tokens after the API prefix, the reply, body and headers.
ApiRequest = tuple[list[str], str, bytes, bytes | None]
#: The lane of a request that names no stream (it runs alone).
BARRIER = ""
#: A pull request's first tokens (``CONSUMER.MSG.NEXT.<stream>.<consumer>``): taken at once, no lane.
PULL = ["CONSUMER", "MSG", "NEXT"]
CREATE = ["STREAM", "CREATE"]
#: How many creates' reply subjects a gateway remembers (``LinkDispatcher._creates_taken``).
CREATES_REMEMBERED = 256


def lane_of(toks: list[str]) -> str | None:
    """The stream a request names (its lane), or None for a request that names none."""
    at = STREAM_TOKEN.get(".".join(toks[:2]))
    return toks[at] if at is not None and len(toks) > at and toks[at] else None


class LinkDispatcher:
    """Routes each message of the link to its component; owns the API lanes (their tasks belong to
    :meth:`api_worker`)."""

    def __init__(
        self,
        domain: str,
        leaf: LeafConnection,
        registry: Registry,
        publish: PublishPath,
        delivery: Delivery,
        api: Api,
        sourcing: Sourcing,
        archives: Archives,
    ) -> None:
        self._sourcing = sourcing
        self._archives = archives
        self.api_prefix = f"$JS.{domain}.API."
        self._kv_prefix = self.api_prefix + "$KV."
        self._leaf = leaf
        self._registry = registry
        self._publish = publish
        self._delivery = delivery
        self._api = api
        #: The running lanes, by stream name (``BARRIER`` for a request that names none).
        self._lanes: dict[str, deque[ApiRequest]] = {}
        #: Requests that wait for a barrier (or are one): started in order by :meth:`_release`.
        self._held: deque[ApiRequest] = deque()
        self._lane_tasks: asyncio.TaskGroup | None = None
        #: Requests waiting or running, bounded by ``API_QUEUE_SIZE``.
        self._api_waiting = 0
        self.api_dropped = 0
        #: Per-stream ownership (#19): whether this gateway answers what names a stream (None: the
        #: account-wide API); every gateway hears every request, and only one may answer it. None:
        #: the gateway owns the whole store and answers everything.
        self.answers: Callable[[str | None], bool] | None = None
        #: Per-stream ownership: whether a stream this gateway does not answer yet will be its own
        #: in a moment (placed on it, being claimed): its API requests then wait in its lane for
        #: :attr:`served` (True: it is served now, answer; False: it is not, no answer), where
        #: they would get no answer at all (a restarted gateway's clients waited a time-out).
        self.awaits: Callable[[str], bool] | None = None
        self.served: Callable[[str], Awaitable[bool]] | None = None
        #: Per-stream ownership: the gathering of account-wide answers (``service.gathering``).
        self.on_gathering: Callable[[Msg], None] | None = None
        #: Per-stream ownership: whether a create of a new stream this gateway would answer went
        #: to the gateway the placement puts it on instead (``Gateway.forwards``).
        self.forwards: Callable[[str, Msg], bool] | None = None
        #: Per-stream ownership: the reply subjects of the last creates this gateway took. A create
        #: forwarded here by the meta owner also reaches this gateway from the client; once the
        #: stream is here (a create of it made again right after the first), both copies would be
        #: answered, and the client's one request counted twice.
        self._creates_taken: deque[str] = deque(maxlen=CREATES_REMEMBERED)

    # ---- what the link hands over (wire.leaf.LinkHandler) ---------------------------------------

    def on_msg(self, msg: Msg) -> None:
        delivery = self._delivery
        subject = msg.subject
        if delivery.queued_acks:
            delivery.apply_acks()  # what this message sees or changes comes after them
        if subject[:1] != "$":  # none of the prefixes below: a publish (most messages)
            self._publish.on_publish(msg)
            return
        is_api = subject.startswith(self.api_prefix)
        if is_api and subject.startswith(self._kv_prefix):
            # A KV publish: leaf links may not carry $KV.>, so the hub maps it into the API
            # domain (DESIGN); it is stored under its $KV subject.
            msg.subject = subject[len(self.api_prefix) :]
            self._publish.on_kv_publish(msg)
            return
        self._publish.accept_queued()  # what this message sees or changes comes after them
        if is_api:
            self._api_request(msg)
        else:
            self._on_other(msg)

    def _on_other(self, msg: Msg) -> None:
        """A ``$`` subject outside the API: an ack, a flow-control reply, a sourcing link's or an
        archive's message, a gathering's; else a publish to a stream subject."""
        subject = msg.subject
        if subject.startswith("$JS.ACK."):
            if self._answers_for(subject):
                self._delivery.on_ack(subject, msg.reply, msg.data)
        elif subject.startswith("$JS.FC."):
            if self._answers_for(subject):
                self._delivery.on_flow_control(subject, msg.hdrs)
        elif subject.startswith(LINK_PREFIX):
            self._sourcing.on_link_msg(msg)
        elif subject.startswith(ARCHIVE_PREFIX):
            self._archives.on_msg(msg)
        elif subject.startswith(GATHERING_PREFIX):
            if self.on_gathering is not None:
                self.on_gathering(msg)
        else:
            self._publish.on_publish(msg)

    def on_acks(self, found: AckRun) -> None:
        """Plain acks from the leaf link: queued, applied before the next message or at the end
        of the read (:meth:`Delivery.apply_acks`), so every change happens in link order."""
        if not self._delivery.queued_acks:
            self._publish.accept_queued()  # what these acks see or change comes after them
        self._delivery.queued_acks += found

    def on_read_done(self) -> None:
        self._delivery.apply_acks()
        self._publish.flush()

    def on_connected(self, info: dict[str, object]) -> None:
        if info.get("version"):
            self._registry.server_version = str(info["version"])

    # ---- API requests -----------------------------------------------------------------------------

    def _answers_for(self, subject: str) -> bool:
        """Whether an ack or flow-control reply (``$JS.ACK.<stream>.…``, ``$JS.FC.<stream>.…``) is
        this gateway's to take: another gateway's stream's would get "no responders" here. An ack
        subject of the newer form names the domain and account hash first."""
        if self.answers is None:
            return True
        toks = subject.split(".")
        return self.answers(toks[4] if toks[1] == "ACK" and len(toks) >= 11 else toks[2])

    def _waits(self, lane: str) -> bool:
        """Whether the requests of ``lane`` wait for its stream to be served here first."""
        return lane != BARRIER and self.awaits is not None and self.awaits(lane)

    async def _served(self, lane: str) -> bool:
        assert self.served is not None, "set with awaits"
        return await self.served(lane)

    def _takes(self, toks: list[str], lane: str | None) -> bool:
        """Whether this gateway takes an API request: it answers what the request names, or its
        stream is about to be served here and the request can wait in its lane (not a pull,
        which a delivery path would take at once for a stream it does not have yet)."""
        if self.answers is None or self.answers(lane):
            return True
        return lane is not None and toks[:3] != PULL and self.awaits is not None and self.awaits(lane)

    def forwarded(self, msg: Msg) -> None:
        """An API request the meta owner forwarded here: this gateway's to answer (a create of
        the stream the placement puts here)."""
        if msg.subject.startswith(self.api_prefix):
            self._api_request(msg, taken=True)

    def _api_request(self, msg: Msg, taken: bool = False) -> None:
        toks = split_api_subject(msg.subject, self.api_prefix) or []
        if not taken:
            forwards = self.forwards
            if toks[:2] == CREATE and len(toks) == 3 and forwards is not None and forwards(toks[2], msg):
                return  # the gateway the new stream is placed on answers
            if not self._takes(toks, lane_of(toks)):
                return  # another gateway's to answer
        if toks[:3] == PULL and len(toks) == 5:
            self._delivery.pull_request(toks[3], toks[4], msg.reply, msg.data, msg.hdrs)
            return
        if toks[:2] == CREATE and msg.reply and self.forwards is not None:
            if msg.reply in self._creates_taken:
                return  # the other copy of this very request is answered already
            self._creates_taken.append(msg.reply)
        if self._api_waiting >= API_QUEUE_SIZE:
            self.api_dropped += 1
            return
        self._api_waiting += 1
        request = (toks, msg.reply, msg.data, msg.hdrs)
        lane = lane_of(toks)
        if lane is None or self._held or BARRIER in self._lanes or self._lane_tasks is None:
            self._held.append(request)
            self._release()
        else:
            self._enqueue(lane, request)

    def _enqueue(self, lane: str, request: ApiRequest) -> None:
        """Queue ``request`` in its lane, starting the lane's task if it is not running."""
        assert self._lane_tasks is not None
        queued = self._lanes.get(lane)
        if queued is None:
            queued = self._lanes[lane] = deque()
            self._lane_tasks.create_task(self._run_lane(lane, queued), name=f"api-lane-{lane}")
        queued.append(request)

    def _release(self) -> None:
        """Start the held requests that may run: those naming a stream up to the first barrier,
        and a barrier once no lane runs any more (then nothing else starts until it is done)."""
        while self._held and self._lane_tasks is not None and BARRIER not in self._lanes:
            lane = lane_of(self._held[0][0])
            if lane is None:
                if self._lanes:
                    return
                lane = BARRIER
            self._enqueue(lane, self._held.popleft())

    async def _run_lane(self, lane: str, queued: deque[ApiRequest]) -> None:
        """Answer a lane's requests in order; the lane ends when it is empty (its next request
        starts it anew), which may let a held barrier start."""
        while queued:
            if not self._waits(lane) or await self._served(lane):
                await self._answer(*queued[0])
            queued.popleft()
            self._api_waiting -= 1
        del self._lanes[lane]
        self._release()

    async def api_worker(self) -> None:
        """Own the lanes' tasks until cancelled; then they are cancelled and awaited (the
        requests they were answering get no answer, as when a server stops)."""
        async with asyncio.TaskGroup() as lanes:
            self._lane_tasks = lanes
            self._release()  # what was read before this task started
            try:
                await asyncio.Event().wait()
            finally:
                self._lane_tasks = None

    async def _answer(self, toks: list[str], reply: str, body: bytes, hdrs: bytes | None) -> None:
        """Answer one request; one that raises is logged and gets no answer (the client times
        out), and its lane goes on with the next."""
        try:
            answer = await self._api.handle(toks, body, hdrs)
        except Exception:
            log.exception("API request %s failed", ".".join(toks))
            return
        if answer is None or not reply:
            return
        if isinstance(answer, list):
            for raw in answer:
                self._leaf.publish(reply, raw.data, hdrs=raw.hdrs or None)
            return
        self._registry.api_total += 1
        if "error" in answer:
            self._registry.api_errors += 1
        self._leaf.publish(reply, json.dumps(answer, separators=(",", ":")).encode())
