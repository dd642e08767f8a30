"""The real parts tests run against: a reference ``nats-server -js`` and jetlake (nats-server plus
the gateway as its own process), each on free loopback ports with a temporary store."""

from __future__ import annotations

import asyncio
import glob
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import nats

from gateway.runtime.embedded import nats_server_binary, server_config

ROOT = Path(__file__).resolve().parent.parent
VOLATILE = {"ts", "created", "first_ts", "last_ts", "last_active", "cluster", "_nats.ver"}


# Below Linux's ephemeral range (32768-60999): a port the kernel hands out for "any free port" can go
# to an outbound connection before the server binds it ("address already in use" in a crash trial).
PORT_RANGE = (20000, 32767)
_given_ports: set[int] = set()


def free_port() -> int:
    """A loopback port no outbound connection will take, and not handed out before in this process."""
    while True:
        port = random.randint(*PORT_RANGE)
        if port in _given_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def spawn(
    args: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """A process whose stdout and stderr append to ``log``. The child holds its own copy of the
    file's descriptor, so ours is closed as soon as it has started: left open, it would be closed by
    the garbage collector, with a ResourceWarning (an error in the tests)."""
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=out, env=env, cwd=cwd)


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ReferenceJetStream:
    """The oracle: the same nats-server binary with JetStream on and a file store, in JetStream
    domain ``domain`` (jetlake's, ``jetlake``, unless another is given; None: no domain), so it
    names its domain wherever jetlake does."""

    def __init__(
        self,
        workdir: Path,
        domain: str | None = "jetlake",
        monitor_port: int = 0,
        sync_interval: str = "",
        leaf_port: int = 0,
        leaf_remotes: tuple[int, ...] = (),
        profile_port: int = 0,
    ) -> None:
        self.workdir = workdir
        self.domain = domain
        self.profile_port = profile_port  # Go's pprof over HTTP (bench --profile), when not 0
        #: A leafnode listener, and the leafnode ports it connects to as a leaf (other systems).
        self.leaf_port = leaf_port
        self.leaf_remotes = leaf_remotes
        self.sync_interval = sync_interval  # the server's ``jetstream { sync_interval }``; "": its default
        self.port = free_port()
        self.monitor_port = monitor_port  # its HTTP monitor (/jsz), when not 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, ready_s: float = 15.0) -> None:
        """``ready_s``: how long its client port may take to open (a server with many streams
        recovers them all first)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = ["-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.workdir / "js")]
        if self.domain or self.sync_interval or self.leaf_port or self.leaf_remotes:
            conf = self.workdir / "nats-server.conf"
            options = [f'store_dir: "{self.workdir / "js"}"']
            options += [f"domain: {self.domain}"] if self.domain else []
            options += [f"sync_interval: {self.sync_interval}"] if self.sync_interval else []
            text = f"jetstream {{ {', '.join(options)} }}\n"
            leafnodes = [f"listen: 127.0.0.1:{self.leaf_port}"] if self.leaf_port else []
            remotes = ", ".join(f'{{ url: "nats-leaf://127.0.0.1:{p}" }}' for p in self.leaf_remotes)
            leafnodes += [f"remotes: [ {remotes} ]"] if remotes else []
            text += f"leafnodes {{ {chr(10).join(leafnodes)} }}\n" if leafnodes else ""
            conf.write_text(text)
            args = ["-c", str(conf), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.monitor_port:
            args += ["-m", str(self.monitor_port)]
        if self.profile_port:
            args += ["--profile", str(self.profile_port)]
        self.proc = spawn([nats_server_binary(), *args], self.workdir / "nats-server.log")
        try:
            wait_port(self.port, self.proc, ready_s)
            if self.monitor_port:
                wait_port(self.monitor_port, self.proc)
        except BaseException:
            stop(self.proc)  # started or not at all: no server outlives a failed start
            raise

    def stop(self) -> None:
        stop(self.proc)


class Jetlake:
    """nats-server (JetStream off, leafnode listener, the domain mappings) and ``jetlake serve``
    attached to it as a separate process, so a test can ``kill -9`` the gateway alone."""

    def __init__(self, workdir: Path, domain: str = "jetlake") -> None:
        self.workdir = workdir
        self.data_root = workdir / "data"
        self.domain = domain
        self.port = free_port()
        self.leaf_port = free_port()
        self.monitor_port = free_port()
        self.server: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        # what the readiness check passes to nats.connect (credentials, where the server needs them)
        self.connect_opts: dict[str, Any] = {}
        self.gateway_env: dict[str, str] = {}  # JETLAKE_* settings for the gateway process
        self.gateway_cwd = ROOT  # the checkout whose gateway runs (a bench compares two)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def leaf_url(self) -> str:
        """Where the gateway attaches (subclasses add credentials or ``tls://``)."""
        return f"nats-leaf://127.0.0.1:{self.leaf_port}"

    def server_conf(self) -> str:
        return server_config("127.0.0.1", self.port, "127.0.0.1", self.leaf_port, self.domain)

    def start(self) -> None:
        """Both processes or neither: a start that fails (a gateway never ready) leaves no process
        behind for the caller, which has nothing to stop yet."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_server()
            self.start_gateway()
        except BaseException:
            stop(self.gateway)
            stop(self.server)
            raise

    def start_server(self) -> None:
        conf = self.workdir / "nats-server.conf"
        conf.write_text(self.server_conf())
        self.server = spawn([nats_server_binary(), "-c", str(conf)], self.workdir / "nats-server.log")
        try:
            wait_port(self.port, self.server)
            wait_port(self.leaf_port, self.server)
        except BaseException:
            stop(self.server)
            raise

    def gateway_command(self, monitor_port: int, leaf_url: str | None = None) -> list[str]:
        """``jetlake serve`` attached to this server's leafnode port (or ``leaf_url``), on this
        store root."""
        return [
            sys.executable,
            # printed to gateway.log, which ``stop`` reads: a leak in the gateway fails the test
            "-W",
            "default::ResourceWarning",
            "-m",
            "gateway",
            "serve",
            "--nats-url",
            leaf_url or self.leaf_url,
            "--data-root",
            str(self.data_root),
            "--domain",
            self.domain,
            "--monitor-port",
            str(monitor_port),
        ]

    def start_gateway(
        self, extra_env: dict[str, str] | None = None, ready_s: float = 60.0, wait: bool = True
    ) -> None:
        env = {**os.environ, **self.gateway_env, **(extra_env or {})}
        self.gateway = spawn(
            self.gateway_command(self.monitor_port),
            self.workdir / "gateway.log",
            env=env,
            cwd=self.gateway_cwd,
        )
        if wait:
            try:
                asyncio.run(self._wait_ready(ready_s))
            except BaseException:
                stop(self.gateway)
                raise

    async def _wait_ready(self, wait_s: float = 60.0) -> None:
        """Ready when the API answers through the server (the leaf is up and subscribed) and the
        monitor takes connections."""
        nc = await nats.connect(self.url, **self.connect_opts)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                assert self.gateway is not None
                if self.gateway.poll() is not None:
                    raise RuntimeError(
                        f"gateway exited with {self.gateway.returncode}; see {self.workdir}/gateway.log"
                    )
                try:
                    await nc.request("$JS.API.INFO", b"", timeout=0.5)
                    # the monitor starts after the gateway: a test may ask it next
                    await asyncio.to_thread(
                        wait_port, self.monitor_port, self.gateway, deadline - time.monotonic()
                    )
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def kill_gateway(self) -> None:
        """``kill -9``: no clean shutdown, whatever was in flight is cut off."""
        stop(self.gateway, signal.SIGKILL)

    def stop_gateway(self) -> int:
        assert self.gateway is not None
        stop(self.gateway, signal.SIGTERM)
        return self.gateway.returncode

    def stop(self) -> None:
        """Stops both processes, then fails if the gateway ever leaked a file, socket, transport or
        event loop (its ResourceWarnings, which the tests' own process turns into errors)."""
        stop(self.gateway)
        stop(self.server)
        assert_no_leaks(self.workdir / "gateway.log")


def assert_no_leaks(log: Path) -> None:
    """A gateway's log names no file, socket, transport or event loop it leaked (ResourceWarning)."""
    leaks = [line for line in _read(log).splitlines() if "ResourceWarning" in line]
    assert not leaks, f"the gateway leaked resources (see {log}):\n" + "\n".join(leaks)


class Peer:
    """Another gateway on the same hub and store root, with a log of its own."""

    def __init__(
        self,
        gw: Jetlake,
        name: str,
        env: dict[str, str] | None = None,
        leaf_url: str | None = None,
        host: str | None = None,
    ) -> None:
        self.log = gw.workdir / f"{name}.log"
        command = gw.gateway_command(free_port(), leaf_url)
        if host is not None:  # a host name of its own (a UTS namespace): as if on another machine
            command = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', host, *command]
        self.proc: subprocess.Popen[bytes] = spawn(
            command, self.log, env={**os.environ, **(env or {})}, cwd=ROOT
        )

    def text(self) -> str:
        return _read(self.log)

    def stop(self) -> None:
        stop(self.proc)
        assert_no_leaks(self.log)


def wait_log(path: Path, text: str, timeout: float = 30.0) -> None:
    """Until ``text`` appears in the log of a process (what it says is all a test can see)."""
    deadline = time.monotonic() + timeout
    while text not in _read(path):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


Server = TypeVar("Server", bound=ReferenceJetStream | Jetlake)


def serving(target: Server) -> Iterator[Server]:
    """A started server for a fixture's lifetime (``yield from serving(...)``), stopped after it,
    also when the fixture's user failed."""
    target.start()
    try:
        yield target
    finally:
        target.stop()


@contextmanager
def linked_core(work: Path) -> Iterator[tuple[ReferenceJetStream, Jetlake, ReferenceJetStream]]:
    """Two systems, each with a JetStream in domain ``core`` joined to it by a leaf link: the real
    JetStream (a leafnode listener) and jetlake's hub; all three started, stopped after, once the
    core's API answers through the links (where mirrors and sources of another domain are tried)."""
    reference = ReferenceJetStream(work / "reference", leaf_port=free_port())
    lake = Jetlake(work / "jetlake")
    core = ReferenceJetStream(
        work / "core", domain="core", leaf_remotes=(reference.leaf_port, lake.leaf_port)
    )
    with ExitStack() as started:
        for server in (reference, lake, core):
            server.start()
            started.callback(server.stop)
        asyncio.run(_domain_answers(core.url))
        yield reference, lake, core


async def _domain_answers(core_url: str) -> None:
    async with await nats.connect(core_url) as nc:
        for _ in range(100):
            info = await nc.request("$JS.API.INFO", b"", timeout=5)
            if b"domain" in info.data:
                return
            await asyncio.sleep(0.05)


def duckdb_connection() -> Any:
    """DuckDB with the delta extension from the ``duckdb-extension-delta`` wheel (no download)."""
    import duckdb
    import duckdb_extension_delta

    pkg = Path(duckdb_extension_delta.__file__).parent
    ext = glob.glob(str(pkg / "extensions" / "*" / "delta.duckdb_extension"))[0]
    con = duckdb.connect(config={"allow_unsigned_extensions": True})
    con.execute(f"LOAD '{ext}'")
    return con


def scrub(value: Any) -> Any:
    """An API answer without the fields that differ between any two runs (times, server ids)."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


@contextmanager
def moto_s3() -> Iterator[str]:
    """A local S3 emulator (moto's server on loopback) with an empty bucket ``lake``; yields its
    endpoint."""
    import boto3

    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
        ).create_bucket(Bucket="lake")
        yield endpoint
    finally:
        stop(proc)


def s3_options(endpoint: str) -> dict[str, str]:
    """The storage options that reach :func:`moto_s3`'s bucket."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
