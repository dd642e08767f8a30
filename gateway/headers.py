"""Status header blocks (``NATS/1.0 404 No Messages\r\n…\r\n\r\n``) for status messages."""

from __future__ import annotations


def status_block(code: int, text: str, extra: dict[str, str] | None = None) -> bytes:
    """A status message's header block, e.g. ``NATS/1.0 404 No Messages``."""
    lines = [f"NATS/1.0 {code} {text}" if text else f"NATS/1.0 {code}"]
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def no_responders(api_subject: str) -> dict[str, str]:
    """The headers of the server's "no responders" status (503) for an API request nobody
    subscribes to; ``api_subject`` is the part after ``$JS.API.``. The gateway listens to the whole
    API, so it sends this itself, naming the subject as clients send it (before the hub maps it
    into jetlake's domain)."""
    return {"Nats-Subject": "$JS.API." + api_subject}
