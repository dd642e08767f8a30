"""``jetlake`` command line: ``jetlake serve`` runs the gateway (and, by default, its nats-server)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.abc
import importlib.machinery
import logging
import signal
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.cli import inspect as inspect_cli
from gateway.cli import repair as repair_cli
from gateway.runtime.settings import LOADER, Settings
from spark_jobs import cli as jobs_cli
from storage_delta.format.settings import SettingsError

if TYPE_CHECKING:
    from gateway.monitor.app import MonitorServer
    from gateway.service.gateway import Gateway
    from gateway.service.ownership import Ownership

log = logging.getLogger("jetlake")
LOOPBACK = ("127.0.0.1", "::1", "localhost")
GC_GEN0_THRESHOLD = 50_000  # allocations between young collections (CPython default: 700)


class PandasUnavailable(importlib.abc.MetaPathFinder):
    """Makes pandas look not installed to the serving process.

    pyarrow imports pandas, if it is installed (pyspark needs it in the same environment), on its
    first conversion of a Python object (``pa.array([...])``, ``Schema.empty_table()``, a filtered
    parquet read): 0.3 to 0.4 s of a gateway's start on a quiet machine and up to a second on a
    loaded one, all of it before a restarted gateway's first answer (#22). The gateway never makes
    a DataFrame; pyarrow, deltalake and the monitor do without pandas when it is missing."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (jetlake serve)", name=fullname)
        return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jetlake", description="NATS JetStream served from a Delta Lake")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    LOADER.add_flags(serve)
    inspect_cli.add_parsers(sub)
    repair_cli.add_parser(sub)
    jobs_cli.add_parser(sub)
    return p


async def serve(settings: Settings) -> int:
    # Imported here so the inspection commands start without loading the storage engine.
    from gateway.runtime.embedded import EmbeddedServer

    # Loaded before standing by, not at takeover: importing the storage engine takes most of a second.
    from gateway.service.gateway import Gateway  # noqa: F401
    from gateway.service.ownership import Ownership
    from storage_delta.commit.lease import open_lease, warm_up
    from storage_delta.commit.store import StoreRoot
    from storage_delta.format.schema import CATALOG, CATALOG_SCHEMA

    # The monitor's web stack (FastAPI, pydantic, uvicorn: 0.5 s quiet, 1.5 s at a load of 12) is
    # imported on a worker thread beside the lease, the tables and the leaf link, whose time is
    # mostly the store's and the network's: a restart's first answer does not wait for it, a
    # standby has it before it takes over, and the monitor starts once both are done. On the event
    # loop after the link was up it held every answer of a takeover for seconds on a loaded machine.
    monitor_stack = (
        asyncio.create_task(asyncio.to_thread(_import_monitor_stack), name="monitor-import")
        if settings.monitor_port
        else None
    )
    embedded: EmbeddedServer | None = None
    if settings.embedded:
        workdir = Path(settings.data_root if "://" not in settings.data_root else ".") / ".nats-server"
        embedded = EmbeddedServer(
            str(workdir), settings.host, settings.client_port, settings.leaf_port, settings.domain
        )
        await embedded.start()
        settings = replace(settings, nats_url=embedded.leaf_url)
        log.info("embedded nats-server: clients connect to %s", embedded.client_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    root = StoreRoot(settings.data_root, settings.storage_options or None)
    ownership = Ownership(
        await asyncio.to_thread(open_lease, root), settings.owner_lease_ms / 1000, settings.leaf_name
    )
    await asyncio.to_thread(warm_up, root, CATALOG, CATALOG_SCHEMA)
    try:
        await _serve_streams(settings, ownership, stop, monitor_stack)
    finally:
        if monitor_stack is not None:
            await monitor_stack  # a thread's import cannot be cut short; its error surfaces here
        await ownership.leave()
        if embedded is not None:
            await embedded.stop()
    return 0


def _import_monitor_stack() -> None:
    import uvicorn  # noqa: F401

    from gateway.monitor.app import build_app  # noqa: F401


async def _serve_streams(
    settings: Settings, ownership: Ownership, stop: asyncio.Event, monitor_stack: asyncio.Task[None] | None
) -> None:
    """Serve the streams placed on this gateway until ``stop``, standing by for the store lease
    meanwhile, whose holder places the streams (:mod:`gateway.service.placing`): a lone gateway
    serves every stream, and another one started on the same root takes its share (#19)."""
    from gateway.service.gateway import Gateway
    from gateway.service.placing import Placing

    gateway = Gateway(settings, ownership)
    monitor = None
    tasks: list[asyncio.Task[None]] = []
    announcing: asyncio.Task[None] | None = None
    try:
        await gateway.start()
        # Announced only now that it can claim and serve: announced from the process's start, a
        # gateway joining an object store was live to the meta owner seconds before it could take
        # anything, got streams placed on it (their owners handed them over at once) and left
        # them unserved until its start ended, and its announcements, late while its start held
        # the loop, made it look gone again and the streams move back (#19).
        announcing = asyncio.create_task(ownership.announce(), name="announce")
        _tune_gc()
        placing = Placing(ownership, gateway)
        tasks = [
            asyncio.create_task(placing.lead(), name="meta-owner"),
            asyncio.create_task(placing.follow(), name="placement-follower"),
        ]
        monitor = await _start_monitor(settings, gateway, monitor_stack)
        print(f"jetlake serving domain {settings.domain!r}, data in {settings.data_root}", flush=True)
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _stop_monitor(monitor)
        await gateway.close()
        await ownership.release()
        if announcing is not None:
            announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcing


async def _start_monitor(
    settings: Settings, gateway: Gateway, monitor_stack: asyncio.Task[None] | None
) -> tuple[MonitorServer, asyncio.Task[None]] | None:
    """The monitor of a started gateway, once its ``monitor_stack`` is imported (None: off)."""
    if monitor_stack is None:
        return None
    await monitor_stack
    import uvicorn

    from gateway.monitor.app import MonitorServer, build_app

    if not settings.monitor_token and settings.monitor_host not in LOOPBACK:
        log.warning(
            "monitor on %s without a monitor_token: anyone who reaches it can read it",
            settings.monitor_host,
        )
    config = uvicorn.Config(
        build_app(gateway),
        host=settings.monitor_host,
        port=settings.monitor_port,
        log_level="warning",
        lifespan="off",
    )
    server = MonitorServer(config)
    return server, asyncio.create_task(server.serve(), name="monitor")


async def _stop_monitor(monitor: tuple[MonitorServer, asyncio.Task[None]] | None) -> None:
    if monitor is not None:
        server, task = monitor
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _tune_gc() -> None:
    """Keep the cyclic collector off the publish path. Every message leaves a few objects alive
    until its commit (and in the tail cache), so with the default thresholds full collections
    kept walking the whole heap (every imported module included) and took most of the ingest
    time. What start-up loaded is frozen out of collection; collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop``'s loop, or None for the standard library's (``event_loop``)."""
    if name != "uvloop":
        return None
    import uvloop  # imported here: the other commands need no event loop of their own

    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        sys.meta_path.insert(0, PandasUnavailable())
        try:
            settings = LOADER.load(vars(args))
        except SettingsError as exc:
            print(f"jetlake serve: {exc}", file=sys.stderr)
            return 2
        with asyncio.Runner(loop_factory=_loop_factory(settings.event_loop)) as runner:
            return runner.run(serve(settings))
    if args.command == "jobs":
        return jobs_cli.main(args)
    if args.command == "repair":
        return repair_cli.run(args)
    return inspect_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
