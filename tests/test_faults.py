"""Transport and storage faults under load: the leaf link cut, the nats-server restarted, the store
full or read-only. Clients get errors or time-outs meanwhile, never a PubAck for a message that is
not stored; afterwards the gateway serves again and the tables are whole."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.harness import Jetlake, duckdb_connection, free_port, stop

#: ``alone``: full, read-only and slow stores; their timings assume the disk to themselves.
pytestmark = pytest.mark.alone

WORKERS = 8
RESUMED = 50  # PubAcks after the fault that show publishing resumed


class Proxy:
    """A TCP proxy on loopback between the gateway and the leafnode port, which a test can sever:
    every connection through it is closed at once, as a network fault would."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.upstream_port = upstream_port
        self.accepted = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)

    def sever(self) -> None:
        def cut() -> None:
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            # the pipes see the abort and end: none is destroyed pending when the loop stops
            pipes = asyncio.all_tasks() - {asyncio.current_task()}
            if pipes:
                await asyncio.wait(pipes, timeout=3)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()  # an event loop left open is a ResourceWarning when it is collected


class ProxiedJetlake(Jetlake):
    """jetlake whose gateway reaches the leafnode port through a :class:`Proxy`."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.proxy = Proxy(self.leaf_port)

    @property
    def leaf_url(self) -> str:
        return f"nats-leaf://127.0.0.1:{self.proxy.port}"

    def start(self) -> None:
        self.proxy.start()
        try:
            super().start()
        except BaseException:
            self.proxy.close()
            raise

    def stop(self) -> None:
        super().stop()
        self.proxy.close()


@dataclass
class LoadResult:
    acked: dict[int, bytes] = field(default_factory=dict)  # seq -> payload the client sent
    errors: Counter[str] = field(default_factory=Counter)
    acked_after_fault: int = 0


async def publish_load(
    url: str, stream: str, fault: Callable[[], Awaitable[None]], settle_s: float = 1.5
) -> LoadResult:
    """Publishers with unique payloads run before, during and after ``fault``; what each PubAck
    said is recorded with the payload it acknowledged."""
    out = LoadResult()
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, error_cb=_quiet)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        done = asyncio.Event()
        fault_over = asyncio.Event()
        resumed = asyncio.Event()

        async def publisher(w: int) -> None:
            i = 0
            while not done.is_set():
                payload = f"{w}-{i}".encode()
                i += 1
                try:
                    ack = await js.publish(f"{stream.lower()}.{w}", payload, timeout=1)
                except Exception as exc:  # every kind of failure is an allowed answer; counted below
                    out.errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.05)
                    continue
                assert ack.stream == stream
                assert ack.seq not in out.acked, f"seq {ack.seq} acknowledged twice"
                out.acked[ack.seq] = payload
                if fault_over.is_set():
                    out.acked_after_fault += 1
                    if out.acked_after_fault >= RESUMED:
                        resumed.set()

        tasks = [asyncio.create_task(publisher(w)) for w in range(WORKERS)]
        await asyncio.sleep(0.7)
        await fault()
        fault_over.set()
        await asyncio.sleep(settle_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(resumed.wait(), 20)
        done.set()
        await asyncio.gather(*tasks)
    finally:
        await nc.close()
    return out


async def _quiet(exc: Exception) -> None:
    """Disconnections are the point of these tests; nats-py reports them here."""


async def read_back(url: str, stream: str, n: int) -> dict[int, bytes]:
    """Every message of the stream, read through the API with a pull consumer."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)).data)
        assert info["state"]["messages"] == n
        assert info["state"]["first_seq"] == 1
        assert info["state"]["last_seq"] == n
        sub = await js.pull_subscribe(f"{stream.lower()}.>", durable="readback", stream=stream)
        got: dict[int, bytes] = {}
        while len(got) < n:
            for m in await sub.fetch(min(500, n - len(got)), timeout=10):
                got[m.metadata.sequence.stream] = m.data
                await m.ack()
        return got
    finally:
        await nc.close()


def stored_rows(gw: Jetlake, stream: str) -> dict[int, bytes]:
    """The stream's rows as an independent Delta reader (DuckDB) sees them."""
    rows = (
        duckdb_connection()
        .execute(
            "SELECT seq, data FROM delta_scan(?) WHERE stream = ? ORDER BY seq",
            [str(gw.data_root / "messages"), stream],
        )
        .fetchall()
    )
    seqs = [r[0] for r in rows]
    assert len(seqs) == len(set(seqs)), "a sequence is stored twice"
    return {int(seq): bytes(data) for seq, data in rows}


def assert_no_false_puback(gw: Jetlake, stream: str, load: LoadResult) -> None:
    """Every PubAck'd message is stored under the sequence its PubAck named, with the payload that
    was published; the stream is contiguous; the API and the table agree."""
    rows = stored_rows(gw, stream)
    assert sorted(rows) == list(range(1, len(rows) + 1))
    for seq, payload in load.acked.items():
        assert rows.get(seq) == payload, f"PubAck for seq {seq} but the table holds {rows.get(seq)!r}"
    assert asyncio.run(read_back(gw.url, stream, len(rows))) == rows


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedJetlake]:
    gw = ProxiedJetlake(tmp_path)
    gw.start()
    yield gw
    gw.stop()


@pytest.mark.slow
def test_leaf_link_cut_under_load(proxied: ProxiedJetlake) -> None:
    """The gateway's connection is cut three times mid-load: it reconnects each time and resumes."""
    cuts = 3

    async def fault() -> None:
        for _ in range(cuts):
            proxied.proxy.sever()
            await asyncio.sleep(0.6)

    load = asyncio.run(publish_load(proxied.url, "CUT", fault))
    assert proxied.proxy.accepted >= cuts + 1, "the gateway did not reconnect after every cut"
    assert load.acked_after_fault >= RESUMED, f"publishing did not resume: {load.errors}"
    assert_no_false_puback(proxied, "CUT", load)
    print(f"cut: {len(load.acked)} acked, errors {dict(load.errors)}")


@pytest.mark.slow
def test_nats_server_restart_under_load(tmp_path: Path) -> None:
    """The nats-server is restarted mid-load: clients and the gateway reconnect, publishing resumes."""
    gw = Jetlake(tmp_path)
    gw.start()
    try:

        async def fault() -> None:
            await asyncio.to_thread(stop, gw.server)
            await asyncio.sleep(0.5)
            await asyncio.to_thread(gw.start_server)

        load = asyncio.run(publish_load(gw.url, "RESTART", fault, settle_s=3.0))
        assert load.acked_after_fault >= RESUMED, f"publishing did not resume: {load.errors}"
        assert sum(load.errors.values()) > 0, "the restart went unnoticed: the test proved nothing"
        assert_no_false_puback(gw, "RESTART", load)
        print(f"restart: {len(load.acked)} acked, errors {dict(load.errors)}")
    finally:
        gw.stop()


LEAF_START_WAIT_S = 3  # how long the gateway waits for its leaf link at start-up (leaf.py)


@pytest.mark.slow
def test_gateway_started_before_its_hub(tmp_path: Path) -> None:
    """The hub is not up when the gateway starts, nor for a while after its start-up wait: the
    gateway keeps trying, and serves once the hub comes."""
    gw = Jetlake(tmp_path)
    gw.workdir.mkdir(parents=True, exist_ok=True)
    try:
        gw.start_gateway(wait=False)
        time.sleep(LEAF_START_WAIT_S + 2)
        assert gw.gateway is not None
        assert gw.gateway.poll() is None, "the gateway gave up on a hub that was not up yet"
        gw.start_server()
        asyncio.run(gw._wait_ready(30))
        asyncio.run(create_stream(gw.url, "LATE"))
        assert [a.get("seq") for a in asyncio.run(publish_each(gw.url, "LATE", [b"x"]))] == [1]
    finally:
        gw.stop()


# ---- storage faults ---------------------------------------------------------------------------


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs as the store root, so a test can fill it or make it read-only (the tests run
    as root, for whom a chmod alone would not stop writes)."""
    mnt = tmp_path / "store"
    mnt.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.fail(f"cannot mount a tmpfs for the storage-fault tests: {exc}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


class StoreJetlake(Jetlake):
    def __init__(self, workdir: Path, data_root: Path) -> None:
        super().__init__(workdir)
        self.data_root = data_root


async def publish_each(url: str, stream: str, payloads: list[bytes]) -> list[dict[str, Any]]:
    """One publish per payload, as raw requests: the PubAck or the error JSON, verbatim."""
    nc = await nats.connect(url)
    try:
        out = []
        for p in payloads:
            msg = await nc.request(f"{stream.lower()}.x", p, timeout=5)
            out.append(json.loads(msg.data))
        return out
    finally:
        await nc.close()


async def create_stream(url: str, stream: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    finally:
        await nc.close()


def _fill(mnt: Path) -> Path:
    """Take every free byte of the filesystem."""
    filler = mnt / "filler"
    with filler.open("wb") as fh, contextlib.suppress(OSError):
        chunk = b"\0" * (1 << 20)
        while True:
            fh.write(chunk)
            fh.flush()
    with contextlib.suppress(OSError), filler.open("ab") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()
    return filler


STORE_ERROR = {"code": 503, "err_code": 10077}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["full", "read_only"])
def test_store_fault_fails_publishes_then_recovers(tmp_path: Path, small_fs: Path, fault: str) -> None:
    """A full or read-only store root: publishes get JetStream's store-failed error (503/10077), no
    PubAck; nothing already stored is damaged; once space (or write access) returns, publishing
    resumes with the next sequence, and a restart sees exactly the PubAck'd messages."""
    gw = StoreJetlake(tmp_path / "gw", small_fs / "data")
    gw.start()
    try:
        asyncio.run(create_stream(gw.url, "DISK"))
        before = asyncio.run(publish_each(gw.url, "DISK", [b"a", b"b", b"c"]))
        assert [a.get("seq") for a in before] == [1, 2, 3]

        filler: Path | None = None
        if fault == "full":
            filler = _fill(small_fs)
        else:
            _mount("-o", "remount,ro", str(small_fs))
        during = asyncio.run(publish_each(gw.url, "DISK", [os.urandom(256 * 1024) for _ in range(3)]))
        for answer in during:
            # an error answer names the stream with seq 0, as the real server's does
            assert "error" in answer, f"PubAck while the store cannot be written: {answer}"
            assert not answer.get("seq"), answer
            err = answer["error"]
            assert {k: err[k] for k in STORE_ERROR} == STORE_ERROR
            assert err["description"].startswith("message not stored: ")

        if filler is not None:
            filler.unlink()
        else:
            _mount("-o", "remount,rw", str(small_fs))
        after = asyncio.run(publish_each(gw.url, "DISK", [b"d", b"e"]))
        assert [a.get("seq") for a in after] == [4, 5], after

        rows = stored_rows(gw, "DISK")
        assert rows == {1: b"a", 2: b"b", 3: b"c", 4: b"d", 5: b"e"}
        assert gw.stop_gateway() == 0
        gw.start_gateway()
        assert asyncio.run(read_back(gw.url, "DISK", 5)) == rows
    finally:
        gw.stop()
        shutil.rmtree(small_fs / "data", ignore_errors=True)
