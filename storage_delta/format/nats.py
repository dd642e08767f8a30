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


def tokens(subject: str) -> list[str]:
    return subject.split(".")


def is_valid_subject(subject: str, allow_wildcards: bool = True) -> bool:
    """A subject of non-empty tokens without whitespace; ``>`` only last, wildcards alone in a token."""
    if not subject or any(c in subject for c in " \t\r\n"):
        return False
    toks = subject.split(".")
    for i, tok in enumerate(toks):
        if not tok:
            return False
        if tok in ("*", ">") and (not allow_wildcards or (tok == ">" and i != len(toks) - 1)):
            return False
    return True


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some literal subject is matched by both ``a`` and ``b``."""
    at, bt = a.split("."), b.split(".")
    for i in range(max(len(at), len(bt))):
        x = at[i] if i < len(at) else None
        y = bt[i] if i < len(bt) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and x != "*" and y != "*":
            return False
    return True


class _Node:
    """One token's level of a :class:`SubjectIndex`: the filters that end here, the next tokens."""

    __slots__ = ("ends", "next")

    def __init__(self) -> None:
        self.ends: set[str] = set()
        self.next: dict[str, _Node] = {}


class SubjectIndex:
    """Subject filters (a stream's ``subjects``) by token, each under the names that hold it: which
    names capture a literal subject, and which hold a filter that overlaps a given one, found by
    walking the tokens instead of testing every filter. Why: a publish to a subject not seen before
    and every stream create looked at each stream in turn, so creating n streams, and publishing
    once to each, cost n² subject tests (10,000 streams: 10^8)."""

    def __init__(self) -> None:
        self._root = _Node()

    def add(self, filter: str, name: str) -> None:
        node = self._root
        for tok in filter.split("."):
            node = node.next.setdefault(tok, _Node())
        node.ends.add(name)

    def remove(self, filter: str, name: str) -> None:
        """Forget ``name``'s ``filter``; levels left empty go too, so the index does not keep the
        shape of every stream that ever lived."""
        path = [self._root]
        for tok in filter.split("."):
            child = path[-1].next.get(tok)
            if child is None:
                return
            path.append(child)
        path[-1].ends.discard(name)
        toks = filter.split(".")
        for tok, parent, child in zip(reversed(toks), reversed(path[:-1]), reversed(path[1:]), strict=True):
            if child.ends or child.next:
                break
            del parent.next[tok]

    def matching(self, subject: str) -> set[str]:
        """The names with a filter that ``subject`` (a literal) falls under (:func:`subject_matches`)."""
        toks = subject.split(".")
        if "" in toks:
            return set()
        found: set[str] = set()
        level = [self._root]
        for tok in toks:
            nxt: list[_Node] = []
            for node in level:
                rest = node.next.get(">")  # one or more tokens: this one and any after it
                if rest is not None:
                    found |= rest.ends
                for key in (tok, "*"):
                    child = node.next.get(key)
                    if child is not None:
                        nxt.append(child)
            level = nxt
            if not level:
                return found
        for node in level:
            found |= node.ends
        return found

    def overlapping(self, filter: str) -> set[str]:
        """The names with a filter that some literal subject matches together with ``filter``
        (:func:`subjects_overlap`)."""
        found: set[str] = set()
        self._overlap(self._root, filter.split("."), 0, found)
        return found

    def _overlap(self, node: _Node, toks: list[str], i: int, found: set[str]) -> None:
        if i == len(toks):
            found |= node.ends
            return
        tok = toks[i]
        if tok == ">":  # one or more tokens: every filter with a token here
            stack = list(node.next.values())
            while stack:
                below = stack.pop()
                found |= below.ends
                stack.extend(below.next.values())
            return
        rest = node.next.get(">")
        if rest is not None:
            found |= rest.ends
        if tok == "*":
            for key, child in node.next.items():
                if key != ">":
                    self._overlap(child, toks, i + 1, found)
            return
        for key in (tok, "*"):
            step = node.next.get(key)
            if step is not None:
                self._overlap(step, toks, i + 1, found)


def status_block(code: int, text: str, extra: dict[str, str] | None = None) -> bytes:
    """A status message's header block, e.g. ``NATS/1.0 404 No Messages``."""
    lines = [f"NATS/1.0 {code} {text}" if text else f"NATS/1.0 {code}"]
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def no_responders(subject: str) -> dict[str, str]:
    """The headers of the server's "no responders" status (503) for a request to ``subject``
    nobody subscribes to. The gateway listens to the whole API and to every ack subject, so it
    sends this itself where the server would have nobody, naming the subject as clients send it
    (an API subject before the hub maps it into jetlake's domain)."""
    return {"Nats-Subject": subject}
