"""The HTTP monitor: a FastAPI app in the gateway's process that reads what the gateway already keeps.

Endpoints: ``/healthz`` (the process answers), ``/readyz`` (leaf link up and store open), ``/jsz``
(nats-server's shape), ``/metrics`` (Prometheus text), ``/history`` (the last minutes of rates, lag
and PubAck latency, :mod:`gateway.monitor.history`), ``/lake`` (the tables' side of every stream,
with warnings, :mod:`gateway.monitor.lake`), ``/`` (the dashboard page), ``/docs`` (OpenAPI).
Handlers are ``async`` so they run on the gateway's event loop and read its state between two of
its steps, never from another thread; table reads go to the gateway's executor. With
``monitor_token`` set, ``/jsz``, ``/metrics``, ``/history`` and ``/lake`` need
``Authorization: Bearer <token>``; the probes, the page (which holds no data and sends the token it
is given in its URL fragment) and the API description stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import Iterator
from email.utils import formatdate
from importlib import resources
from typing import Annotated, Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Query, Response
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Message, Receive, Scope, Send

from gateway.monitor import metrics
from gateway.monitor.history import History
from gateway.monitor.jsz import JszOptions, Snapshot, render_jsz, take_snapshot
from gateway.monitor.lake import Lake, render_lake
from gateway.service.gateway import Core, Gateway

BEARER = HTTPBearer(auto_error=False, description="the gateway's monitor_token")


def _dashboard_html() -> str:
    return resources.files("gateway.monitor").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def build_app(gateway: Gateway) -> FastAPI:
    """The monitor's app; its history sampler becomes a task of the gateway's (call it on the
    gateway's running loop)."""
    app = FastAPI(
        title="jetlake monitor",
        description="Health, JetStream state (nats-server's /jsz shape) and Prometheus metrics of a "
        "jetlake gateway.",
    )
    _add_probes(app, gateway)
    history = History()
    gateway.tasks.own(history.run(lambda: gateway.core), "monitor-history")
    _add_state(app, gateway, history, Lake(gateway.root, gateway.executor, gateway.settings))
    page = _dashboard_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    return app


def _add_probes(app: FastAPI, gateway: Gateway) -> None:
    """Liveness and readiness: open to all (an orchestrator asks them), they reveal no state."""

    @app.get(
        "/healthz",
        summary="Liveness: the event loop answers and no background task or commit loop has died",
    )
    async def healthz(response: Response) -> dict[str, Any]:
        problems = gateway.health()
        if problems:
            response.status_code = 503
            return {"status": "unhealthy", "problems": problems}
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: the leaf link is up and the store takes commits")
    async def readyz(response: Response) -> dict[str, Any]:
        core = gateway.core
        leaf = core is not None and core.leaf.connected
        # Messages can be committed, and the ack log takes rows (its bounded queue is not full).
        store = core is not None and core.writer.running and core.acklog.has_room()
        ready = leaf and store
        if not ready:
            response.status_code = 503
        return {"status": "ready" if ready else "unavailable", "leaf_connected": leaf, "store_open": store}


def _add_state(app: FastAPI, gateway: Gateway, history: History, lake: Lake) -> None:
    """/jsz, /metrics, /history and /lake, behind the optional bearer token."""
    settings = gateway.settings

    def authorized(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> None:
        token = settings.monitor_token
        if not token:
            return
        given = creds.credentials if creds is not None else ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "bearer token required", headers={"WWW-Authenticate": "Bearer"})

    def started() -> Core:
        if gateway.core is None:
            raise HTTPException(503, "gateway not started")
        return gateway.core

    async def snapshot() -> Snapshot:
        core = started()
        reg = core.registry
        names = {stream: list(consumers) for stream, consumers in reg.consumers.items()}
        return await take_snapshot(core.api, list(reg.streams), names)

    @app.get(
        "/jsz",
        summary="Streams and consumers with their state, shaped like nats-server's /jsz",
        dependencies=[Depends(authorized)],
    )
    async def jsz(
        accounts: Annotated[bool, Query(description="include the account's details")] = False,
        streams: Annotated[bool, Query(description="include stream details")] = False,
        consumers: Annotated[bool, Query(description="include consumer details (implies streams)")] = False,
        config: Annotated[bool, Query(description="include stream and consumer configs")] = False,
    ) -> dict[str, Any]:
        snap = await snapshot()
        opts = JszOptions(accounts=accounts, streams=streams, consumers=consumers, config=config)
        return render_jsz(snap, opts, settings.leaf_name, settings.data_root, settings.domain)

    @app.get(
        "/metrics",
        summary="Prometheus text exposition",
        response_class=Response,
        dependencies=[Depends(authorized)],
    )
    async def prometheus() -> Response:
        snap = await snapshot()
        report = await lake.report(started())
        body = metrics.render(snap, _counters(started()), report)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    @app.get(
        "/history",
        summary="The last minutes, one sample a second: ingest and delivery rates per stream, lag "
        "and ack-pending per consumer, PubAck latency percentiles",
        dependencies=[Depends(authorized)],
    )
    async def history_json(
        top: Annotated[
            int, Query(ge=1, le=100, description="per metric, the series of the highest latest values")
        ] = 20,
    ) -> dict[str, Any]:
        started()
        return history.render(top)

    @app.get(
        "/lake",
        summary="The tables' side of every stream: files, bytes, compaction and sealing backlog, "
        "removed bytes not yet reclaimed, index snapshots, job runs, and warnings",
        dependencies=[Depends(authorized)],
    )
    async def lake_json() -> dict[str, Any]:
        report = await lake.report(started())
        return render_lake(report, time.time_ns())


def _counters(core: Core) -> metrics.Counters:
    w, leaf, acks = core.writer, core.leaf, core.acklog
    reg = core.registry
    return metrics.Counters(
        publishes=core.publish.received,
        publish_errors=core.publish.failed,
        commits=w.loop.commits,
        messages_committed=w.loop.rows_committed,
        refused=w.refused,
        commit_seconds=w.loop.commit_seconds,
        batch_messages=w.loop.batch_rows,
        acklog_commits=acks.loop.commits,
        acklog_rows=acks.loop.rows_committed,
        acklog_compactions=acks.compactions,
        api_dropped=core.dispatcher.api_dropped,
        leaf_connected=leaf.connected,
        leaf_reconnects=leaf.reconnects,
        leaf_dropped_writes=leaf.dropped_writes,
        puback_seconds=core.publish.puback_seconds,
        stored={name: core.publish.stored.get(name, 0) for name in reg.streams},
        deliveries={(s, n): c.dseq for s, cs in reg.consumers.items() for n, c in cs.items()},
    )


class MonitorServer(uvicorn.Server):
    """uvicorn without signal handlers of its own: the gateway owns SIGINT/SIGTERM, finishes the
    commit in flight and then stops the monitor, so uvicorn must not take the signals first.

    Nor with uvicorn's main loop, which wakes every 100 ms to refresh the ``date`` header and look
    at ``should_exit``: an idle gateway would wake ten times a second for it. Here the loop waits
    for ``should_exit`` to be set (it is an event underneath) and each answer is dated as it
    leaves (:class:`_Dated`). ``limit_max_requests`` and ``callback_notify``, which that loop also
    served, are not used by the gateway."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        config.date_header = False
        config.app = _Dated(config.app)
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the default headers, once
        await self._exit.wait()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Dated:
    """ASGI middleware: a ``date`` header on every HTTP answer, taken when it starts."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dated(message: Message) -> None:
            if message["type"] == "http.response.start":
                date = (b"date", formatdate(usegmt=True).encode())
                message = {**message, "headers": [*message.get("headers", []), date]}
            await send(message)

        await self.app(scope, receive, dated)
