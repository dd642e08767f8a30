"""Text layout for the inspection CLI, after the ``nats`` CLI: rounded box tables for lists, and
right-aligned ``key: value`` sections for info. Pure functions from values to strings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime


def number(n: int) -> str:
    """Counts with thousands separators, as the nats CLI prints them."""
    return f"{n:,}"


def size(n: int) -> str:
    """Bytes in IEC units (``490 B``, ``1.5 KiB``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n:,} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def timestamp(rfc3339: str | None) -> str:
    """A JetStream time as ``YYYY-MM-DD HH:MM:SS UTC``; the zero time is ``never``."""
    if not rfc3339 or rfc3339.startswith("0001-01-01"):
        return "never"
    whole = rfc3339.rstrip("Z").split(".")[0]
    parsed = datetime.fromisoformat(whole).replace(tzinfo=UTC)
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(ns: int) -> str:
    """A Go-style duration (``30s``, ``2m0s``, ``1h0m0s``); 0 is ``unlimited`` for limits."""
    if ns <= 0:
        return "unlimited"
    secs = ns / 1e9
    if secs < 60:
        return f"{secs:g}s"
    minutes, s = divmod(int(secs), 60)
    if minutes < 60:
        return f"{minutes}m{s}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m}m{s}s"


def limit(n: int, fmt: Callable[[int], str] = number) -> str:
    """A limit where -1 means none."""
    return "unlimited" if n < 0 else fmt(n)


def table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """A rounded box table with a title row; the ``right`` columns (numbers) right-aligned."""
    cells = [list(row) for row in rows]
    numeric = [i in right for i in range(len(headers))]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    inner = sum(widths) + 3 * len(widths) - 1

    def line(values: Sequence[str], aligned: bool) -> str:
        parts = [
            v.rjust(w) if aligned and numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "│ " + " │ ".join(parts) + " │"

    def rule(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * (w + 2) for w in widths) + right

    out = [
        "╭" + "─" * inner + "╮",
        "│" + title.center(inner) + "│",
        rule("├", "┬", "┤"),
        line(list(headers), aligned=False),
        rule("├", "┼", "┤"),
        *(line(r, aligned=True) for r in cells),
        rule("╰", "┴", "╯"),
    ]
    return "\n".join(out)


def sections(heading: str, parts: Sequence[tuple[str, Sequence[tuple[str, str]]]]) -> str:
    """A heading, then titled blocks of ``key: value`` lines with the keys right-aligned."""
    width = max((len(k) for _, items in parts for k, _ in items), default=0)
    out = [heading, ""]
    for title, items in parts:
        if title:
            out += [f"{title}:", ""]
        out += [f"  {k.rjust(width)}: {v}" for k, v in items]
        out.append("")
    return "\n".join(out).rstrip("\n")
