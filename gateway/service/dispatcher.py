"""The one ordered dispatcher: everything the leaf link reads (publishes, API requests, pull
requests, acks, flow-control replies) enters here, in the order the link read it.

Order is the contract (docs/architecture.md): a stream changes in wire order, so what a message sees
or changes comes after everything read before it. Publishes are taken in runs and acks in runs for
speed (``PublishPath.accept_queued``, ``Delivery.apply_acks``), so before any other kind of message
the runs read so far are applied first. API requests are answered by one worker from a bounded
queue, in order among themselves, after the publishes read before them were accepted; a request
that finds the queue full is dropped and counted (the client's request times out, as when a server
is overloaded), never queued without bound.
"""

from __future__ import annotations

import asyncio
import json
import logging

from gateway.adapters.archives import PREFIX as ARCHIVE_PREFIX
from gateway.adapters.archives import Archives
from gateway.adapters.delivery import Delivery
from gateway.adapters.publish import PublishPath
from gateway.adapters.registry import Registry
from gateway.adapters.sourcing import LINK_PREFIX, Sourcing
from gateway.handlers.router import Api, split_api_subject
from gateway.wire.leaf import LeafConnection
from gateway.wire.protocol import Msg

log = logging.getLogger(__name__)

#: API requests waiting for the worker; beyond it a request is dropped (``LinkDispatcher.api_dropped``).
API_QUEUE_SIZE = 4096

AckRun = list[tuple[bytes, bytes, bytes, bytes]]


class LinkDispatcher:
    """Routes each message of the link to its component; owns the API queue and its worker's loop."""

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
        self._api_queue: asyncio.Queue[tuple[list[str], str, bytes, bytes | None]] = asyncio.Queue(
            API_QUEUE_SIZE
        )
        self.api_dropped = 0

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
        elif subject.startswith("$JS.ACK."):
            delivery.on_ack(subject, msg.reply, msg.data)
        elif subject.startswith("$JS.FC."):
            delivery.on_flow_control(subject, msg.hdrs)
        elif subject.startswith(LINK_PREFIX):
            self._sourcing.on_link_msg(msg)
        elif subject.startswith(ARCHIVE_PREFIX):
            self._archives.on_msg(msg)
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

    def _api_request(self, msg: Msg) -> None:
        toks = split_api_subject(msg.subject, self.api_prefix) or []
        if toks[:3] == ["CONSUMER", "MSG", "NEXT"] and len(toks) == 5:
            self._delivery.pull_request(toks[3], toks[4], msg.reply, msg.data, msg.hdrs)
            return
        try:
            self._api_queue.put_nowait((toks, msg.reply, msg.data, msg.hdrs))
        except asyncio.QueueFull:
            self.api_dropped += 1

    async def api_worker(self) -> None:
        """Answer queued API requests one at a time; a request that raises is logged and gets no
        answer (the client times out), and the worker goes on with the next."""
        while True:
            toks, reply, body, hdrs = await self._api_queue.get()
            try:
                answer = await self._api.handle(toks, body, hdrs)
            except Exception:
                log.exception("API request %s failed", ".".join(toks))
                continue
            if answer is None or not reply:
                continue
            if isinstance(answer, list):
                for raw in answer:
                    self._leaf.publish(reply, raw.data, hdrs=raw.hdrs or None)
                continue
            self._registry.api_total += 1
            if "error" in answer:
                self._registry.api_errors += 1
            self._leaf.publish(reply, json.dumps(answer, separators=(",", ":")).encode())
