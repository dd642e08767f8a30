"""``jetlake repair``: list the damaged files of a store's tables and what they hold, and with
``--apply`` drop them (``storage_delta.tables.repair``). Run it with the gateway stopped.

Why a command of its own and not something the gateway does at start: dropping a damaged data file
or log line loses its messages for good, which an operator decides (a backup may still hold them).
The gateway only sets damaged checkpoints aside (they are derived data), ignores damaged index
snapshots and rewrites a log entry whose damaged lines it can make again exactly (nothing is lost);
everything else it reports (``/healthz``) and does not serve: a damaged data file's messages, the
streams a damaged ``catalog`` or ``removals`` file concerns, and those a log entry's line that
cannot be made again may concern (the entry set aside at start: ``storage_delta.tables.unresolved``),
offline until repaired."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_ROOT = "./data"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("repair", help="find damaged table files; drop them with --apply")
    p.add_argument("--data-root", default=DEFAULT_ROOT, help="the store root (a local directory)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run", dest="apply", action="store_false", help="only say what would be dropped (default)"
    )
    mode.add_argument("--apply", dest="apply", action="store_true", help="drop the damaged files")
    p.set_defaults(apply=False)


def run(args: argparse.Namespace) -> int:
    """Exit status 0: nothing (left) damaged; 1: damage found in a dry run, or left after applying;
    2: not a local store root."""
    # Imported here so the other commands start without loading the storage engine.
    from storage_delta.commit.store import StoreRoot
    from storage_delta.read import index_snapshot
    from storage_delta.read.reader import MessageReader
    from storage_delta.tables.repair import apply, find_damage

    root = StoreRoot(args.data_root)
    if root.local_path() is None:
        print("jetlake repair: a local store root only (on an object store a PUT is whole or absent)")
        return 2
    reader = MessageReader(root)
    findings = find_damage(
        root, lambda stream, created: index_snapshot.unheld_tail(root, reader, stream, created)
    )
    if not findings:
        print(f"no damaged files under {args.data_root}")
        return 0
    verb = "dropping" if args.apply else "would drop (run with --apply to do it)"
    print(f"{len(findings)} damaged file(s) under {args.data_root}, {verb}:")
    for f in findings:
        print(f"  {f.line()}")
    if not args.apply:
        return 1
    left = apply(root, findings)
    for f in left:
        print(f"  still damaged: {f.line()}")
    print("repaired" if not left else "damage left: see above")
    return 0 if not left else 1
