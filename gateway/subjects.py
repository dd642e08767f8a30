"""NATS subject rules as pure functions: validity, wildcard matching, overlap."""

from __future__ import annotations

from storage_delta.natsfmt import subject_matches

__all__ = ["is_valid_subject", "subject_matches", "subjects_overlap"]


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
