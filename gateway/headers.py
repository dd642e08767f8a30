"""Status header blocks (``NATS/1.0 404 No Messages\r\n…\r\n\r\n``) for status messages."""

from __future__ import annotations


def status_block(code: int, text: str, extra: dict[str, str] | None = None) -> bytes:
    """A status message's header block, e.g. ``NATS/1.0 404 No Messages``."""
    lines = [f"NATS/1.0 {code} {text}" if text else f"NATS/1.0 {code}"]
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
