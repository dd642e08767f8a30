"""Who may write a store: an owner lease with an epoch, and the fence every commit checks.

Several gateways may share one store root; one owns it at a time (docs/architecture.md, "Several
gateways on one store"). Two parts, with different jobs:

* **the lease** (:mod:`storage_delta.commit.lease`) decides who should own: each epoch has exactly
  one claimant (put-if-absent), the owner beats, a standby claims the next epoch when the beat
  stops. Timing only decides *when* to take over;
* **the fence** makes a late writer harmless whatever the timing: a new owner first commits an
  app transaction ``(jetlake-owner, n)`` to every table it writes, before it reads any of them to
  recover; every commit of an owner carries its epoch the same way. A commit claims its log
  version by put-if-absent, and a writer that finds versions taken reads them before it tries the
  next: an epoch above its own there means it was fenced (:class:`Fenced`), and it stops without
  committing or answering. Versions are contiguous, so a stale writer cannot reach a free version
  without passing the fence, and what the new owner recovered is everything the old one committed.
"""

from __future__ import annotations

#: The app id of the owner epoch in every table's Delta log.
OWNER_APP = "jetlake-owner"


class Fenced(Exception):
    """A newer owner epoch is in the table: this writer lost the store and must not commit."""


def check_epoch(found: int, mine: int | None) -> None:
    """Raise :class:`Fenced` when a table's owner epoch ``found`` is past the writer's ``mine``."""
    if mine is not None and found > mine:
        raise Fenced(f"owner epoch {found} took over from epoch {mine}")
