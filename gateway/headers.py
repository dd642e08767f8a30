"""NATS header blocks (``NATS/1.0[ status text]\r\nKey: value\r\n…\r\n\r\n``): parse and build."""

from __future__ import annotations

HEADER_LINE = b"NATS/1.0"


def parse_headers(block: bytes | None) -> dict[str, list[str]]:
    """Header values by name, as published (names keep their case; repeated names keep order)."""
    out: dict[str, list[str]] = {}
    if not block:
        return out
    lines = block.decode(errors="replace").split("\r\n")
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        out.setdefault(name.strip(), []).append(value.strip())
    return out


def header(headers: dict[str, list[str]], name: str) -> str | None:
    """The first value of a header, compared by exact name as nats-server does for ``Nats-*``."""
    values = headers.get(name)
    return values[0] if values else None


def status_block(code: int, text: str, extra: dict[str, str] | None = None) -> bytes:
    """A status message's header block, e.g. ``NATS/1.0 404 No Messages``."""
    lines = [f"NATS/1.0 {code} {text}" if text else f"NATS/1.0 {code}"]
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
