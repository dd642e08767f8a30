"""``jetlake stream ls|info|add|rm`` and ``jetlake consumer ls|info|next``: inspection over the NATS
JetStream API with nats-py, so they work against any JetStream (jetlake or nats-server's own).

Requests go to ``$JS.API.*`` (or ``$JS.<domain>.API.*`` with ``--domain``) as plain JSON; what is
printed is laid out by :mod:`gateway.tables_fmt` after the ``nats`` CLI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gateway.cli import tables as fmt

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

DEFAULT_SERVER = "nats://127.0.0.1:4222"


class CliError(Exception):
    """Something to report as ``nats: error: …`` with exit status 1."""


class Js:
    """The JetStream API over one connection: requests in, answers (or their errors) out."""

    def __init__(self, nc: Client, domain: str, timeout: float) -> None:
        self.nc = nc
        self.prefix = f"$JS.{domain}.API." if domain else "$JS.API."
        self.timeout = timeout

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        from nats.errors import NoRespondersError

        data = json.dumps(body).encode() if body is not None else b""
        try:
            msg = await self.nc.request(self.prefix + subject, data, timeout=self.timeout)
        except NoRespondersError as exc:
            raise CliError("no JetStream responded: is JetStream (or jetlake) reachable?") from exc
        except TimeoutError as exc:
            raise CliError(f"{subject}: no answer within {self.timeout:g}s") from exc
        answer: dict[str, Any] = json.loads(msg.data)
        if "error" in answer:
            err = answer["error"]
            code = f" ({err['err_code']})" if err.get("err_code") else ""
            raise CliError(f"{err.get('description', err)}{code}")
        return answer

    async def names(self, subject: str, key: str) -> list[str]:
        """Every name of a paged NAMES answer."""
        out: list[str] = []
        while True:
            page = await self.request(subject, {"offset": len(out)})
            batch = page.get(key) or []
            out += batch
            if not batch or len(out) >= int(page.get("total", 0)):
                return sorted(out)


# ---- rendering (pure) ----------------------------------------------------------------------------


def stream_list(infos: list[dict[str, Any]]) -> str:
    if not infos:
        return "No Streams defined"
    rows = [
        [
            i["config"]["name"],
            i["config"].get("description", ""),
            fmt.timestamp(i["created"]),
            fmt.number(i["state"]["messages"]),
            fmt.size(i["state"]["bytes"]),
            fmt.timestamp(i["state"].get("last_ts")),
        ]
        for i in infos
    ]
    headers = ["Name", "Description", "Created", "Messages", "Size", "Last Message"]
    return fmt.table("Streams", headers, rows, right=(3, 4))


def _seq_at(seq: int, ts: str | None) -> str:
    return f"{fmt.number(seq)} @ {fmt.timestamp(ts)}"


def stream_info(info: dict[str, Any]) -> str:
    c, st = info["config"], info["state"]
    config = [
        ("Subjects", ", ".join(c.get("subjects") or [])),
        ("Replicas", str(c.get("num_replicas", 1))),
        ("Storage", str(c.get("storage", "file")).capitalize()),
    ]
    options = [
        ("Retention", str(c.get("retention", "limits")).capitalize()),
        ("Acknowledgments", str(not c.get("no_ack", False)).lower()),
        ("Discard Policy", str(c.get("discard", "old")).capitalize()),
        ("Duplicate Window", fmt.duration(int(c.get("duplicate_window", 0)))),
        ("Allows Msg Delete", str(not c.get("deny_delete", False)).lower()),
        ("Allows Purge", str(not c.get("deny_purge", False)).lower()),
        ("Allows Rollups", str(c.get("allow_rollup_hdrs", False)).lower()),
    ]
    limits = [
        ("Maximum Messages", fmt.limit(int(c.get("max_msgs", -1)))),
        ("Maximum Per Subject", fmt.limit(int(c.get("max_msgs_per_subject", -1)))),
        ("Maximum Bytes", fmt.limit(int(c.get("max_bytes", -1)), fmt.size)),
        ("Maximum Age", fmt.duration(int(c.get("max_age", 0)))),
        ("Maximum Message Size", fmt.limit(int(c.get("max_msg_size", -1)), fmt.size)),
        ("Maximum Consumers", fmt.limit(int(c.get("max_consumers", -1)))),
    ]
    state = [
        ("Messages", fmt.number(st["messages"])),
        ("Bytes", fmt.size(st["bytes"])),
        ("First Sequence", _seq_at(st["first_seq"], st.get("first_ts"))),
        ("Last Sequence", _seq_at(st["last_seq"], st.get("last_ts"))),
        ("Deleted Messages", fmt.number(int(st.get("num_deleted", 0)))),
        ("Active Consumers", fmt.number(st.get("consumer_count", 0))),
        ("Number of Subjects", fmt.number(int(st.get("num_subjects", 0)))),
    ]
    heading = f"Information for Stream {c['name']} created {fmt.timestamp(info['created'])}"
    return fmt.sections(heading, [("", config), ("Options", options), ("Limits", limits), ("State", state)])


def consumer_list(stream: str, infos: list[dict[str, Any]]) -> str:
    if not infos:
        return f"No Consumers defined on Stream {stream}"
    rows = [
        [
            i["name"],
            i["config"].get("description", ""),
            fmt.timestamp(i["created"]),
            fmt.number(i["num_ack_pending"]),
            fmt.number(i["num_pending"]),
            fmt.timestamp(i["delivered"].get("last_active")),
        ]
        for i in infos
    ]
    headers = ["Name", "Description", "Created", "Ack Pending", "Unprocessed", "Last Delivery"]
    return fmt.table(f"Consumers on Stream {stream}", headers, rows, right=(3, 4))


def _position(seqs: dict[str, Any]) -> str:
    cseq, sseq = fmt.number(seqs["consumer_seq"]), fmt.number(seqs["stream_seq"])
    return f"Consumer sequence: {cseq} Stream sequence: {sseq}"


def consumer_info(info: dict[str, Any]) -> str:
    c = info["config"]
    filters = c.get("filter_subjects") or ([c["filter_subject"]] if c.get("filter_subject") else [])
    config = [("Name", info["name"])]
    if c.get("durable_name"):
        config.append(("Durable Name", c["durable_name"]))
    if c.get("deliver_subject"):
        config.append(("Delivery Subject", c["deliver_subject"]))
    else:
        config.append(("Pull Mode", "true"))
    if filters:
        config.append(("Filter Subject", ", ".join(filters)))
    max_ack = int(c.get("max_ack_pending", -1))
    max_waiting = int(c.get("max_waiting", 0))
    config += [
        ("Deliver Policy", str(c.get("deliver_policy", "all")).replace("_", " ").title()),
        ("Ack Policy", str(c.get("ack_policy", "none")).capitalize()),
        ("Ack Wait", fmt.duration(int(c.get("ack_wait", 0)))),
        ("Replay Policy", str(c.get("replay_policy", "instant")).capitalize()),
        ("Maximum Deliveries", fmt.limit(int(c.get("max_deliver", -1)))),
        ("Max Ack Pending", fmt.limit(max_ack)),
    ]
    if not c.get("deliver_subject"):
        config.append(("Max Waiting Pulls", fmt.number(max_waiting)))
    state = [
        ("Last Delivered Message", _position(info["delivered"])),
        ("Acknowledgment Floor", _position(info["ack_floor"])),
        ("Outstanding Acks", f"{fmt.number(info['num_ack_pending'])} out of maximum {fmt.limit(max_ack)}"),
        ("Redelivered Messages", fmt.number(info["num_redelivered"])),
        ("Unprocessed Messages", fmt.number(info["num_pending"])),
    ]
    if not c.get("deliver_subject"):
        state.append(
            ("Waiting Pulls", f"{fmt.number(info['num_waiting'])} of maximum {fmt.number(max_waiting)}")
        )
    heading = (
        f"Information for Consumer {info['stream_name']} > {info['name']} "
        f"created {fmt.timestamp(info['created'])}"
    )
    return fmt.sections(heading, [("Configuration", config), ("State", state)])


def delivered_message(msg: Msg) -> str:
    """One message as ``consumer next`` shows it: its delivery metadata, headers and payload."""
    meta = msg.metadata
    when = meta.timestamp.strftime("%H:%M:%S")
    lines = [
        f"[{when}] subj: {msg.subject} / tries: {meta.num_delivered} / cons seq: {meta.sequence.consumer} "
        f"/ str seq: {meta.sequence.stream} / pending: {meta.num_pending}",
        "",
    ]
    if msg.headers:
        lines += ["Headers:", *(f"  {k}: {v}" for k, v in msg.headers.items()), ""]
    lines.append(msg.data.decode("utf-8", errors="replace"))
    return "\n".join(lines)


# ---- commands ------------------------------------------------------------------------------------


async def _stream_ls(js: Js, args: argparse.Namespace) -> str:
    names = await js.names("STREAM.NAMES", "streams")
    return stream_list([await js.request(f"STREAM.INFO.{n}") for n in names])


async def _stream_info(js: Js, args: argparse.Namespace) -> str:
    return stream_info(await js.request(f"STREAM.INFO.{args.stream}"))


async def _stream_add(js: Js, args: argparse.Namespace) -> str:
    config: dict[str, Any] = {
        "name": args.stream,
        "subjects": args.subjects,
        "retention": args.retention,
        "storage": args.storage,
        "discard": args.discard,
        "max_msgs": args.max_msgs,
        "max_bytes": args.max_bytes,
        "max_msgs_per_subject": args.max_msgs_per_subject,
        "max_age": int(args.max_age * 1e9),
        "num_replicas": args.replicas,
    }
    if args.description:
        config["description"] = args.description
    return stream_info(await js.request(f"STREAM.CREATE.{args.stream}", config))


async def _stream_rm(js: Js, args: argparse.Namespace) -> str:
    if not args.force:
        raise CliError(f"deleting Stream {args.stream} needs --force")
    await js.request(f"STREAM.DELETE.{args.stream}")
    return f"Deleted Stream {args.stream}"


async def _consumer_ls(js: Js, args: argparse.Namespace) -> str:
    names = await js.names(f"CONSUMER.NAMES.{args.stream}", "consumers")
    infos = [await js.request(f"CONSUMER.INFO.{args.stream}.{n}") for n in names]
    return consumer_list(args.stream, infos)


async def _consumer_info(js: Js, args: argparse.Namespace) -> str:
    return consumer_info(await js.request(f"CONSUMER.INFO.{args.stream}.{args.consumer}"))


async def _consumer_next(js: Js, args: argparse.Namespace) -> str:
    out: list[str] = []
    subject = f"{js.prefix}CONSUMER.MSG.NEXT.{args.stream}.{args.consumer}"
    # The pull waits a little less than the client so that an empty consumer answers 408 in time.
    body = json.dumps({"batch": 1, "expires": int(js.timeout * 0.9 * 1e9)}).encode()
    # A delivery arrives on the inbox under its stored subject, so nats-py's request() (which matches
    # answers by subject) cannot take it: a subscription of our own does.
    inbox = js.nc.new_inbox()
    sub = await js.nc.subscribe(inbox)
    try:
        for _ in range(args.count):
            await js.nc.publish(subject, body, reply=inbox)
            try:
                msg = await sub.next_msg(timeout=js.timeout)
            except TimeoutError as exc:
                raise CliError(f"no message received within {js.timeout:g}s") from exc
            status = (msg.headers or {}).get("Status")
            if status:
                desc = (msg.headers or {}).get("Description", "")
                raise CliError(f"no message received: {status} {desc}".strip())
            out.append(delivered_message(msg))
            if not args.no_ack:
                await js.nc.request(msg.reply, b"+ACK", timeout=js.timeout)  # answered once acked
                out += ["", "Acknowledged message"]
            out.append("")
    finally:
        await sub.unsubscribe()
    return "\n".join(out).rstrip("\n")


Command = Callable[[Js, argparse.Namespace], Awaitable[str]]


def add_parsers(sub: Any) -> None:
    """The ``stream`` and ``consumer`` command groups, added to ``jetlake``'s subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--server", "-s", default=os.environ.get("NATS_URL", DEFAULT_SERVER), help="NATS URL (env NATS_URL)"
    )
    common.add_argument("--domain", default="", help="JetStream domain ($JS.<domain>.API)")
    common.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")

    stream = sub.add_parser("stream", help="inspect and manage streams").add_subparsers(
        dest="action", required=True
    )
    stream.add_parser("ls", parents=[common], help="list streams").set_defaults(run=_stream_ls)
    p = stream.add_parser("info", parents=[common], help="a stream's config and state")
    p.add_argument("stream")
    p.set_defaults(run=_stream_info)
    p = stream.add_parser("add", parents=[common], help="create a stream")
    p.add_argument("stream")
    p.add_argument("--subjects", nargs="+", required=True)
    p.add_argument("--description", default="")
    p.add_argument("--retention", choices=["limits", "interest", "workqueue"], default="limits")
    p.add_argument("--storage", choices=["file", "memory"], default="file")
    p.add_argument("--discard", choices=["old", "new"], default="old")
    p.add_argument("--max-msgs", type=int, default=-1)
    p.add_argument("--max-bytes", type=int, default=-1)
    p.add_argument("--max-msgs-per-subject", type=int, default=-1)
    p.add_argument("--max-age", type=float, default=0, help="seconds (0: unlimited)")
    p.add_argument("--replicas", type=int, default=1)
    p.set_defaults(run=_stream_add)
    p = stream.add_parser("rm", parents=[common], help="delete a stream and its messages")
    p.add_argument("stream")
    p.add_argument("--force", "-f", action="store_true", help="really delete")
    p.set_defaults(run=_stream_rm)

    consumer = sub.add_parser("consumer", help="inspect consumers").add_subparsers(
        dest="action", required=True
    )
    p = consumer.add_parser("ls", parents=[common], help="list a stream's consumers")
    p.add_argument("stream")
    p.set_defaults(run=_consumer_ls)
    p = consumer.add_parser("info", parents=[common], help="a consumer's config and state")
    p.add_argument("stream")
    p.add_argument("consumer")
    p.set_defaults(run=_consumer_info)
    p = consumer.add_parser(
        "next", parents=[common], help="fetch (and ack) the next messages of a pull consumer"
    )
    p.add_argument("stream")
    p.add_argument("consumer")
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--no-ack", action="store_true", help="leave the messages unacknowledged")
    p.set_defaults(run=_consumer_next)


async def _run(args: argparse.Namespace) -> str:
    # nats-py is imported here, not with the module: every ``jetlake`` command builds this module's
    # parsers, and ``jetlake serve``'s start (a restart's time to its first answer) has no use for it.
    import nats

    nc = await nats.connect(args.server, connect_timeout=args.timeout, max_reconnect_attempts=0)
    try:
        command: Command = args.run
        return await command(Js(nc, args.domain, args.timeout), args)
    finally:
        await nc.close()


async def execute(args: argparse.Namespace) -> tuple[int, str, str]:
    """One parsed command: exit status, standard output and standard error, as printed."""
    from nats.errors import NoServersError

    try:
        return 0, await _run(args) + "\n", ""
    except CliError as err:
        return 1, "", f"nats: error: {err}\n"
    except (OSError, NoServersError) as err:
        return 1, "", f"nats: error: cannot connect to {args.server}: {err}\n"


def run(args: argparse.Namespace) -> int:
    status, out, err = asyncio.run(execute(args))
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status
