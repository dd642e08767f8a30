"""Deleting files no table version needs any more, without deleting a writer's files in flight.

A writer puts its parquet file in the table's directory first and commits the ``add`` after; in
between the file is referenced by nothing. ``vacuum`` deletes unreferenced files older than its
retention, and in ``full`` mode it also sweeps files no tombstone names, so with a retention shorter
than a writer's write→commit time it deletes a file that is about to be committed (delta-rs #3645):
the commit then lands and points at nothing. jetlake's writers commit within milliseconds of
writing (seconds with retries), so every vacuum keeps at least ``MIN_RETENTION_HOURS``: a margin
of more than a thousand times the longest write→commit gap, and long enough for any reader that
opened an older version to finish.
"""

from __future__ import annotations

from storage_delta.commit.store import StoreRoot, open_existing, retry_listing
from storage_delta.format import schema as sch

MIN_RETENTION_HOURS = 1


def vacuum(
    root: StoreRoot, retention_hours: int = 24, dry_run: bool = True, table: str = sch.MESSAGES
) -> list[str]:
    """Delete (or with ``dry_run`` only list) files of ``table`` unreferenced for
    ``retention_hours``; a dry run by default, as delta-rs's own ``vacuum``."""
    if retention_hours < MIN_RETENTION_HOURS:
        raise ValueError(
            f"retention of {retention_hours} h is below the {MIN_RETENTION_HOURS} h safety margin: "
            "files a writer has written but not yet committed could be deleted"
        )
    dt = open_existing(root, table)
    if dt is None:
        return []
    # the table may be one a gateway appends to: its listing can race a commit
    return retry_listing(
        lambda: dt.vacuum(
            retention_hours=retention_hours, dry_run=dry_run, enforce_retention_duration=False, full=True
        )
    )
