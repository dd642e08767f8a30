"""The gateway's leaf link authenticates every way a leaf node can (user/password, token, nkey,
creds/JWT, TLS with and without a client certificate), is refused with wrong credentials, and the
NATS permissions docs/security.md gives are what a client and the gateway need."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nkeys
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from gateway.wire.leafauth import CredentialsError, LeafTarget, SubscribePermissions, read_creds
from tests.harness import Jetlake, ReferenceJetStream, spawn, wait_port
from tests.natsauth import (
    account_jwt,
    account_key,
    make_tls,
    operator_jwt,
    operator_key,
    user_jwt,
    user_key,
    write_creds,
)

MAPPINGS = '"$JS.API.>": "$JS.jetlake.API.>", "$KV.>": "$JS.jetlake.API.$KV.>"'


@dataclass
class Setup:
    """One way to secure the hub: its config, the gateway's URL and settings, a client's options."""

    leafnodes: str  # the body of the server's ``leafnodes { … }`` block, after ``listen``
    scheme_auth: str = ""  # what goes before host:port in the leaf URL, e.g. "nats-leaf://u:p@"
    gateway_env: dict[str, str] = field(default_factory=dict)
    client_opts: dict[str, Any] = field(default_factory=dict)
    top: str = f"mappings {{ {MAPPINGS} }}"  # the rest of the server config


class SecuredJetlake(Jetlake):
    def __init__(self, workdir: Path, setup: Setup) -> None:
        super().__init__(workdir)
        self.setup = setup
        self.connect_opts = setup.client_opts
        self.gateway_env = setup.gateway_env

    @property
    def leaf_url(self) -> str:
        return f"{self.setup.scheme_auth or 'nats-leaf://'}127.0.0.1:{self.leaf_port}"

    def server_conf(self) -> str:
        return (
            f"listen: 127.0.0.1:{self.port}\n"
            f"leafnodes {{\n  listen: 127.0.0.1:{self.leaf_port}\n{self.setup.leafnodes}\n}}\n"
            f"{self.setup.top}\n"
        )


def user_password(tmp: Path) -> Setup:
    return Setup(
        "authorization { user: leaf, password: 's3cr#t pw' }",
        scheme_auth="nats-leaf://leaf:s3cr%23t%20pw@",
    )


def token(tmp: Path) -> Setup:
    """nats-server's ``leafnodes { authorization }`` takes no token: the server-wide one applies
    to leaf connections too (and to clients)."""
    return Setup(
        "",
        scheme_auth="nats-leaf://tok-123@",
        client_opts={"token": "tok-123"},
        top=f"authorization {{ token: 'tok-123' }}\nmappings {{ {MAPPINGS} }}",
    )


def nkey(tmp: Path) -> Setup:
    """Leafnode users take no nkey in nats-server's config: a server-wide nkey user does."""
    user = user_key()
    seed = tmp / "gateway.nk"
    seed.write_text(user.seed + "\n")
    return Setup(
        "",
        gateway_env={"JETLAKE_NKEY_SEED_FILE": str(seed)},
        client_opts={"user": "cli", "password": "cli"},
        top=(
            f"authorization {{ users: [ {{ nkey: {user.public} }}, {{ user: cli, password: cli }} ] }}\n"
            f"mappings {{ {MAPPINGS} }}"
        ),
    )


def creds(tmp: Path) -> Setup:
    """Operator mode: operator, account (with the domain mappings in its JWT) and users, all JWTs."""
    op, acc = operator_key(), account_key()
    gw, cli = user_key(), user_key()
    acc_jwt = account_jwt(op, acc, "APP", {"$JS.API.>": "$JS.jetlake.API.>"})
    gw_creds = write_creds(tmp / "gateway.creds", user_jwt(acc, gw, "gateway"), gw)
    cli_creds = write_creds(tmp / "client.creds", user_jwt(acc, cli, "client"), cli)
    return Setup(
        "",
        gateway_env={"JETLAKE_CREDS_FILE": str(gw_creds)},
        client_opts={"user_credentials": str(cli_creds)},
        top=(
            f"operator: {operator_jwt(op)}\n"
            "resolver: MEMORY\n"
            f"resolver_preload: {{ {acc.public}: {acc_jwt} }}\n"
        ),
    )


def tls(tmp: Path) -> Setup:
    files = make_tls(tmp / "tls")
    return Setup(
        f"tls {{ cert_file: '{files.cert}', key_file: '{files.key}' }}",
        scheme_auth="tls://",
        gateway_env={"JETLAKE_TLS_CA_FILE": str(files.ca)},
    )


def mutual_tls(tmp: Path) -> Setup:
    """The server verifies the gateway's client certificate; the URL stays ``nats-leaf://``: the
    server's INFO says TLS is required."""
    files = make_tls(tmp / "tls")
    return Setup(
        f"tls {{ cert_file: '{files.cert}', key_file: '{files.key}', ca_file: '{files.ca}', verify: true }}",
        gateway_env={
            "JETLAKE_TLS_CA_FILE": str(files.ca),
            "JETLAKE_TLS_CERT_FILE": str(files.cert.parent / "client.pem"),
            "JETLAKE_TLS_KEY_FILE": str(files.cert.parent / "client-key.pem"),
        },
    )


SETUPS: dict[str, Callable[[Path], Setup]] = {
    "user_password": user_password,
    "token": token,
    "nkey": nkey,
    "creds": creds,
    "tls": tls,
    "mutual_tls": mutual_tls,
}


async def round_trip(url: str, opts: dict[str, Any], stream: str) -> dict[str, Any]:
    """Create a stream, publish, pull and ack through the hub: the API, the publish path and a
    delivery all cross the leaf link."""
    nc = await nats.connect(url, **opts)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        ack = await js.publish(f"{stream.lower()}.a", b"hello")
        sub = await js.pull_subscribe(f"{stream.lower()}.>", durable="d")
        msgs = await sub.fetch(1, timeout=5)
        await msgs[0].ack()
        return {"seq": ack.seq, "subject": msgs[0].subject, "data": msgs[0].data}
    finally:
        await nc.close()


@pytest.mark.parametrize("name", list(SETUPS))
def test_gateway_authenticates(tmp_path: Path, name: str) -> None:
    """The gateway joins a hub that demands these credentials and serves the API through it."""
    gw = SecuredJetlake(tmp_path, SETUPS[name](tmp_path))
    gw.start()
    try:
        out = asyncio.run(round_trip(gw.url, gw.connect_opts, "SECURE"))
        assert out == {"seq": 1, "subject": "secure.a", "data": b"hello"}
    finally:
        gw.stop()


def _break_password(s: Setup) -> Setup:
    s.scheme_auth = "nats-leaf://leaf:wrong@"
    return s


def _break_token(s: Setup) -> Setup:
    s.scheme_auth = "nats-leaf://nope@"
    return s


def _break_nkey(s: Setup) -> Setup:
    other = Path(s.gateway_env["JETLAKE_NKEY_SEED_FILE"]).with_name("other.nk")
    other.write_text(user_key().seed)
    s.gateway_env["JETLAKE_NKEY_SEED_FILE"] = str(other)
    return s


def _break_tls(s: Setup) -> Setup:
    del s.gateway_env["JETLAKE_TLS_CA_FILE"]  # the system's CAs do not know the test CA
    return s


def _break_mutual_tls(s: Setup) -> Setup:
    del s.gateway_env["JETLAKE_TLS_CERT_FILE"]
    del s.gateway_env["JETLAKE_TLS_KEY_FILE"]
    return s


@pytest.mark.waits
@pytest.mark.parametrize(
    ("name", "breaks", "logged"),
    [
        # a wrong password: the server refuses the leaf
        ("user_password", _break_password, "Authorization Violation"),
        # a wrong token
        ("token", _break_token, "Authorization Violation"),
        # a seed the server does not know
        ("nkey", _break_nkey, "Authorization Violation"),
        # a server certificate the gateway cannot verify: the gateway refuses the server
        ("tls", _break_tls, "CERTIFICATE_VERIFY_FAILED"),
        # no client certificate where the server demands one
        ("mutual_tls", _break_mutual_tls, "leaf connection lost"),
    ],
)
def test_gateway_refused_without_right_credentials(
    tmp_path: Path, name: str, breaks: Callable[[Setup], Setup], logged: str
) -> None:
    """With wrong credentials nothing is served (clients get no responders) and the gateway keeps
    retrying, saying why in its log."""
    gw = SecuredJetlake(tmp_path, breaks(SETUPS[name](tmp_path)))
    gw.workdir.mkdir(parents=True, exist_ok=True)
    gw.start_server()
    log = gw.workdir / "gateway.log"
    try:
        gw.start_gateway(wait=False)
        deadline = time.monotonic() + 60
        # two refusals logged: it tried, and tried again
        while not log.exists() or log.read_text().count(logged) < 2:
            assert gw.gateway is not None
            assert gw.gateway.poll() is None, "the gateway gave up instead of retrying"
            assert time.monotonic() < deadline, f"no {logged!r} in the gateway's log"
            time.sleep(0.2)
        assert asyncio.run(api_answers(gw.url, gw.connect_opts)) is False
        assert gw.gateway is not None
        assert gw.gateway.poll() is None
    finally:
        gw.stop()


async def api_answers(url: str, opts: dict[str, Any]) -> bool:
    nc = await nats.connect(url, **opts)
    try:
        await nc.request("$JS.API.INFO", b"", timeout=1)
        return True
    except (NoRespondersError, NatsTimeout):
        return False
    finally:
        await nc.close()


# ---- permissions ------------------------------------------------------------------------------

# The permission sets docs/security.md gives, for a stream on ``orders.>``. nats-server checks a
# client's publish permissions on the subject *after* the account's mappings, so API subjects are
# granted in both forms: ``$JS.API.…`` for the real JetStream, ``$JS.jetlake.API.…`` for jetlake.


def api_perms(*subjects: str) -> str:
    return ", ".join(f'"$JS.API.{s}", "$JS.jetlake.API.{s}"' for s in subjects)


ADMIN_PERMS = f'{{ publish: [{api_perms(">")}], subscribe: ["_INBOX.>"] }}'
APP_PERMS = (
    f'{{ publish: ["orders.>", {api_perms("CONSUMER.INFO.ORDERS.*", "CONSUMER.MSG.NEXT.ORDERS.*")},'
    ' "$JS.ACK.ORDERS.>"], subscribe: ["_INBOX.>"] }'
)
GATEWAY_PERMS = (
    '{ publish: ["_INBOX.>", "$JS.EVENT.>"], subscribe: ["$JS.jetlake.API.>", "$JS.ACK.>", "orders.>"] }'
)


def accounts_conf(jetstream: bool) -> str:
    users = ["{ user: root, password: root }"]
    users.append(f"{{ user: admin, password: admin, permissions: {ADMIN_PERMS} }}")
    users.append(f"{{ user: app, password: app, permissions: {APP_PERMS} }}")
    extra = "jetstream: enabled" if jetstream else f"mappings {{ {MAPPINGS} }}"
    if not jetstream:
        users.append(f"{{ user: gateway, password: gw, permissions: {GATEWAY_PERMS} }}")
    return (
        "accounts {\n  APP {\n    users: [\n      "
        + "\n      ".join(users)
        + f"\n    ]\n    {extra}\n  }}\n}}"
    )


class PermissionedReference(ReferenceJetStream):
    """The real JetStream with the same accounts and permissions."""

    def start(self, ready_s: float = 15.0) -> None:
        from gateway.runtime.embedded import nats_server_binary

        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nats-server.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"jetstream {{ store_dir: '{self.workdir / 'js'}' }}\n"
            f"{accounts_conf(jetstream=True)}\n"
        )
        self.proc = spawn([nats_server_binary(), "-c", str(conf)], self.workdir / "nats-server.log")
        wait_port(self.port, self.proc, ready_s)


@pytest.fixture(scope="module")
def permissioned(tmp_path_factory: pytest.TempPathFactory) -> Any:
    ref = PermissionedReference(Path(tmp_path_factory.mktemp("perm-ref")))
    setup = Setup("", scheme_auth="nats-leaf://gateway:gw@", top=accounts_conf(jetstream=False))
    setup.client_opts = {"user": "admin", "password": "admin"}
    lake = SecuredJetlake(Path(tmp_path_factory.mktemp("perm-lake")), setup)
    ref.start()
    try:
        lake.start()
        try:
            yield {"jetstream": ref.url, "jetlake": lake.url}
        finally:
            lake.stop()
    finally:
        ref.stop()


async def attempt(url: str, user: str, subject: str, body: dict[str, Any] | None = None) -> str:
    """What a client sees for one API request: the answer's error code, "ok", or a time-out (the
    server refused the publish: a permissions violation, which the client only sees as silence)."""
    nc = await nats.connect(url, user=user, password=user, error_cb=_ignore)
    try:
        msg = await nc.request(subject, json.dumps(body or {}).encode(), timeout=1.5)
        answer = json.loads(msg.data)
        return f"error {answer['error']['err_code']}" if "error" in answer else "ok"
    except NatsTimeout:
        return "timeout"
    except NoRespondersError:
        return "no responders"
    finally:
        await nc.close()


async def _ignore(exc: Exception) -> None:
    """Permission violations arrive as async errors; the test looks at their effect instead."""


async def stream_names(url: str) -> list[str]:
    nc = await nats.connect(url, user="root", password="root")
    try:
        msg = await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=5)
        return sorted(json.loads(msg.data)["streams"] or [])
    finally:
        await nc.close()


ORDERS = {"name": "ORDERS", "subjects": ["orders.>"]}


async def permissions_case(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["app creates"] = await attempt(url, "app", "$JS.API.STREAM.CREATE.ORDERS", ORDERS)
    out["after app create"] = await stream_names(url)
    out["admin creates"] = await attempt(url, "admin", "$JS.API.STREAM.CREATE.ORDERS", ORDERS)
    # the app user may not create consumers: the admin makes the durable the app reads from
    out["admin creates consumer"] = await attempt(
        url,
        "admin",
        "$JS.API.CONSUMER.CREATE.ORDERS.dispatch",
        {"stream_name": "ORDERS", "config": {"durable_name": "dispatch", "ack_policy": "explicit"}},
    )
    out["app deletes"] = await attempt(url, "app", "$JS.API.STREAM.DELETE.ORDERS")
    out["after app delete"] = await stream_names(url)
    nc = await nats.connect(url, user="app", password="app", error_cb=_ignore)
    try:
        js = nc.jetstream()
        out["app publishes"] = (await js.publish("orders.new", b"x")).seq
        sub = await js.pull_subscribe("orders.>", durable="dispatch", stream="ORDERS")
        msgs = await sub.fetch(1, timeout=5)
        await msgs[0].ack()
        out["app consumes"] = [m.subject for m in msgs]
    finally:
        await nc.close()
    return out


@pytest.mark.waits
async def test_client_permissions_same_as_jetstream(permissioned: dict[str, str]) -> None:
    """A client without ``$JS.API.STREAM.>`` cannot create or delete a stream but publishes and
    consumes; an admin with ``$JS.API.>`` can create: the same on the real JetStream and jetlake."""
    results = {target: await permissions_case(url) for target, url in permissioned.items()}
    assert results["jetlake"] == results["jetstream"]
    out = results["jetlake"]
    assert out["app creates"] == "timeout"
    assert out["after app create"] == []
    assert out["admin creates"] == "ok"
    assert out["admin creates consumer"] == "ok"
    assert out["app deletes"] == "timeout"
    assert out["after app delete"] == ["ORDERS"]
    assert out["app publishes"] == 1
    assert out["app consumes"] == ["orders.new"]


async def test_domain_subject_is_covered_by_permissions(permissioned: dict[str, str]) -> None:
    """A client allowed only its stream subjects cannot reach the gateway's domain subject
    ``$JS.jetlake.API.>`` directly either (the mapping is no way around the permissions)."""
    got = await attempt(
        permissioned["jetlake"], "app", "$JS.jetlake.API.STREAM.CREATE.SNEAKY", {"name": "SNEAKY"}
    )
    assert got == "timeout"
    assert "SNEAKY" not in await stream_names(permissioned["jetlake"])


async def test_gateway_limited_to_documented_permissions(permissioned: dict[str, str]) -> None:
    """The gateway's own user may subscribe only to ``orders.>`` among stream subjects: a stream on
    other subjects can be created but its publishes reach no one, and the link stays up."""
    url = permissioned["jetlake"]
    assert await attempt(url, "admin", "$JS.API.STREAM.CREATE.OTHER", {"name": "OTHER"}) == "ok"
    nc = await nats.connect(url, user="root", password="root")
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            with pytest.raises(NoRespondersError):
                await nc.request("OTHER", b"x", timeout=1)
            await asyncio.sleep(0.2)
    finally:
        await nc.close()
    assert await attempt(url, "admin", "$JS.API.INFO") == "ok"


# ---- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # user and password, URL-encoded
        ("nats-leaf://u:p%40ss@hub:7000", {"user": "u", "password": "p@ss", "tls": False, "port": 7000}),
        # a lone user part is a token
        ("nats-leaf://tok@hub", {"token": "tok", "user": None, "port": 7422}),
        # tls:// and nats-leaf+tls:// ask for TLS
        ("tls://hub:7422", {"tls": True}),
        ("nats-leaf+tls://hub", {"tls": True}),
        # no scheme: a leaf URL
        ("hub:7001", {"host": "hub", "port": 7001, "tls": False}),
    ],
)
def test_leaf_target_parse(url: str, expected: dict[str, Any]) -> None:
    target = LeafTarget.parse(url)
    assert {k: getattr(target, k) for k in expected} == expected


def test_tls_when_the_server_requires_it() -> None:
    """A plain URL still upgrades when the server's INFO says TLS is required."""
    assert LeafTarget.parse("nats-leaf://hub").wants_tls({"tls_required": True})
    assert not LeafTarget.parse("nats-leaf://hub").wants_tls({})


def test_creds_file_round_trip(tmp_path: Path) -> None:
    user = user_key()
    path = write_creds(tmp_path / "u.creds", "header.claims.sig", user)
    assert read_creds(str(path)) == ("header.claims.sig", user.seed)
    auth = LeafTarget.parse("hub", creds_file=str(path)).connect_auth("nonce")
    assert auth["jwt"] == "header.claims.sig"
    sig = str(auth["sig"])
    # base64url without padding, as nats-server expects; verifies against the user's public key
    assert nkeys.from_seed(user.seed.encode()).verify(b"nonce", base64.urlsafe_b64decode(sig + "=="))


def test_missing_credentials_file_is_a_credentials_error(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError):
        LeafTarget.parse("hub", nkey_seed_file=str(tmp_path / "absent.nk")).connect_auth("n")


@pytest.mark.parametrize(
    ("allow", "deny", "subject", "allowed"),
    [
        # no import permissions: everything
        ((), (), "orders.>", True),
        # a literal under an allowed wildcard
        (("orders.>",), (), "orders.new", True),
        # a subject outside every allow entry
        (("orders.>",), (), "other", False),
        # a wildcard wider than an allow entry: the hub accepts it from a leaf and prunes
        (("orders.>",), (), ">", True),
        # a wildcard that meets no allow entry
        (("orders.>",), (), "other.*", False),
        # deny wins over allow
        (("orders.>",), ("orders.secret",), "orders.secret", False),
    ],
)
def test_subscribe_permissions(
    allow: tuple[str, ...], deny: tuple[str, ...], subject: str, allowed: bool
) -> None:
    perms = SubscribePermissions.from_info({"import": {"allow": list(allow), "deny": list(deny)}})
    assert perms.allows(subject) is allowed
