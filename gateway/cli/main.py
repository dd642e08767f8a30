"""``jetlake`` command line: ``jetlake serve`` runs the gateway (and, by default, its nats-server)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from pathlib import Path

from gateway.cli import inspect as inspect_cli
from gateway.runtime import settings as settings_mod
from spark_jobs import cli as jobs_cli

log = logging.getLogger("jetlake")
LOOPBACK = ("127.0.0.1", "::1", "localhost")
GC_GEN0_THRESHOLD = 50_000  # allocations between young collections (CPython default: 700)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jetlake", description="NATS JetStream served from a Delta Lake")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--conf", help="configuration file (default conf/jetlake.toml)")
    serve.add_argument("--nats-url", help="leafnode URL of an existing nats-server (nats-leaf://host:port)")
    serve.add_argument("--data-root", help="store root: a directory or an object-store URI")
    serve.add_argument("--client-port", type=int, help="embedded nats-server client port")
    serve.add_argument("--leaf-port", type=int, help="embedded nats-server leafnode port")
    serve.add_argument("--domain", help="JetStream domain served ($JS.<domain>.API.>)")
    serve.add_argument("--monitor-port", type=int, help="HTTP monitor port (0: no monitor)")
    serve.add_argument("--creds-file", help="NATS credentials file for the leaf connection")
    inspect_cli.add_parsers(sub)
    jobs_cli.add_parser(sub)
    return p


async def serve(settings: settings_mod.Settings) -> int:
    # Imported here so the inspection commands start without loading the storage engine.
    from gateway.runtime.embedded import EmbeddedServer
    from gateway.service.gateway import Gateway

    embedded: EmbeddedServer | None = None
    if settings.embedded:
        workdir = Path(settings.data_root if "://" not in settings.data_root else ".") / ".nats-server"
        embedded = EmbeddedServer(
            str(workdir), settings.host, settings.client_port, settings.leaf_port, settings.domain
        )
        await embedded.start()
        settings = settings_mod.replace(settings, nats_url=embedded.leaf_url)
        log.info("embedded nats-server: clients connect to %s", embedded.client_url)
    gateway = Gateway(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    monitor_task: asyncio.Task[None] | None = None
    uv_server = None
    try:
        await gateway.start()
        _tune_gc()
        if settings.monitor_port:
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
            uv_server = MonitorServer(config)
            monitor_task = asyncio.create_task(uv_server.serve(), name="monitor")
        print(f"jetlake serving domain {settings.domain!r}, data in {settings.data_root}", flush=True)
        await stop.wait()
    finally:
        if uv_server is not None and monitor_task is not None:
            uv_server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await monitor_task
        await gateway.close()
        if embedded is not None:
            await embedded.stop()
    return 0


def _tune_gc() -> None:
    """Keep the cyclic collector off the publish path. Every message leaves a few objects alive
    until its commit (and in the tail cache), so with the default thresholds full collections
    kept walking the whole heap (every imported module included) and took most of the ingest
    time. What start-up loaded is frozen out of collection; collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        settings = settings_mod.load(
            args.conf,
            {
                "nats_url": args.nats_url,
                "data_root": args.data_root,
                "client_port": args.client_port,
                "leaf_port": args.leaf_port,
                "domain": args.domain,
                "monitor_port": args.monitor_port,
                "creds_file": args.creds_file,
            },
        )
        return asyncio.run(serve(settings))
    if args.command == "jobs":
        return jobs_cli.main(args)
    return inspect_cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
