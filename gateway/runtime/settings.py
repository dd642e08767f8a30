"""One typed settings object per process: conf/jetlake.toml, then JETLAKE_* variables, then flags.

Read when a process starts (``load``), never at import time.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace

__all__ = ["Settings", "load", "replace"]
from pathlib import Path
from typing import Any

DEFAULT_CONF = Path(__file__).resolve().parent.parent / "conf" / "jetlake.toml"


@dataclass(frozen=True)
class Settings:
    data_root: str = "./data"
    nats_url: str = ""
    host: str = "127.0.0.1"
    client_port: int = 4222
    leaf_port: int = 7422
    domain: str = "jetlake"
    monitor_host: str = "127.0.0.1"
    monitor_port: int = 8222
    monitor_token: str = ""
    max_pending_bytes: int = 64 * 1024 * 1024
    tail_cache_bytes: int = 32 * 1024 * 1024
    ack_flush_interval_ms: int = 100
    acklog_max_pending: int = 100_000
    acklog_compact_rows: int = 250_000
    index_snapshot_interval_ms: int = 10_000
    index_snapshot_min_new: int = 10_000
    leaf_name: str = "jetlake"
    creds_file: str = ""
    nkey_seed_file: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    storage_options: dict[str, str] = field(default_factory=dict)

    @property
    def embedded(self) -> bool:
        return not self.nats_url


def _coerce(kind: Any, value: str) -> Any:
    if kind in (int, "int"):
        return int(value)
    if kind in (dict, "dict[str, str]"):
        return dict(item.split("=", 1) for item in value.split(",") if item)
    return value


def load(
    conf_file: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None
) -> Settings:
    """Settings from the config file, the environment (``JETLAKE_<FIELD>``) and explicit overrides."""
    path = Path(conf_file) if conf_file else Path(os.environ.get("JETLAKE_CONF", DEFAULT_CONF))
    values: dict[str, Any] = {}
    if path.exists():
        with path.open("rb") as fh:
            values.update(tomllib.load(fh))
    known = {f.name: f.type for f in fields(Settings)}
    unknown = set(values) - set(known)
    if unknown:
        raise ValueError(f"{path}: unknown settings {sorted(unknown)}")
    for name, kind in known.items():
        env = os.environ.get(f"JETLAKE_{name.upper()}")
        if env is not None:
            values[name] = _coerce(kind, env)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
    return replace(Settings(), **values)
