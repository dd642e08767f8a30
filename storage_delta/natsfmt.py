"""How NATS subjects and header blocks read, as stored in the tables: pure functions shared by the
gateway (consumer filters) and the Spark source (subject filters, the headers column)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=65536)
def subject_matches(filter: str, subject: str) -> bool:
    """Whether ``subject`` falls under the NATS subject ``filter``.

    ``*`` stands for exactly one token and a final ``>`` for one or more. An empty filter matches
    everything, as an empty ``filter_subject`` does on a JetStream consumer. Wildcards are only
    wildcards as whole tokens (``a*`` is a literal), and subjects with empty tokens never match.
    """
    if not filter:
        return True
    ftoks = filter.split(".")
    stoks = subject.split(".")
    if "" in stoks:
        return False
    for i, ft in enumerate(ftoks):
        if ft == ">" and i == len(ftoks) - 1:
            return len(stoks) > i
        if i >= len(stoks):
            return False
        if ft != "*" and ft != stoks[i]:
            return False
    return len(stoks) == len(ftoks)


def parse_headers(block: bytes | None) -> dict[str, str]:
    """The headers of a raw NATS header block, first value per name.

    Names keep their case because NATS headers are case-sensitive on the wire. The status line
    (``NATS/1.0 503``) is not a header and is skipped; bytes that are not UTF-8 are replaced rather
    than failing a whole Spark task over one odd publisher.
    """
    headers: dict[str, str] = {}
    if not block:
        return headers
    for line in block.decode("utf-8", errors="replace").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name and name not in headers:
            headers[name] = value.strip()
    return headers
