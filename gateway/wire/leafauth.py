"""Where the leaf link connects and how it proves who it is: URL, credentials and TLS.

The gateway authenticates to nats-server's leafnode listener the way any leaf node does: user and
password or a token in the URL, an nkey (seed file: the server's nonce is signed), a ``.creds``
file (user JWT + seed, for operator/JWT deployments), and TLS (``tls://``/``nats-leaf+tls://`` or a
server that requires it) with a CA file and, for mutual TLS, a client certificate. docs/security.md
says which permissions that identity needs.
"""

from __future__ import annotations

import base64
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from storage_delta.format.nats import subject_matches, subjects_overlap

if TYPE_CHECKING:
    from gateway.runtime.settings import Settings

TLS_SCHEMES = ("tls", "nats-leaf+tls", "wss")
_CREDS_BLOCK = re.compile(r"-{3,}[^\n]*BEGIN[^\n]*-{3,}\s*\n(.*?)\n\s*-{3,}[^\n]*END[^\n]*-{3,}", re.S)


class CredentialsError(Exception):
    """A credentials, seed or TLS file the settings name is missing or unreadable."""


@dataclass(frozen=True)
class LeafTarget:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls: bool = False
    creds_file: str | None = None
    nkey_seed_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @classmethod
    def parse(cls, url: str, **files: str | None) -> LeafTarget:
        """``nats-leaf://[user:password@|token@]host[:port]``; ``tls://`` asks for TLS."""
        u = urlparse(url if "://" in url else f"nats-leaf://{url}")
        user = unquote(u.username) if u.username else None
        password = unquote(u.password) if u.password else None
        token = None
        if user and password is None:
            token, user = user, None
        return cls(
            host=u.hostname or "127.0.0.1",
            port=u.port or 7422,
            user=user,
            password=password,
            token=token,
            tls=u.scheme in TLS_SCHEMES,
            **{k: v or None for k, v in files.items()},
        )

    @classmethod
    def from_settings(cls, s: Settings) -> LeafTarget:
        return cls.parse(
            s.nats_url,
            creds_file=s.creds_file,
            nkey_seed_file=s.nkey_seed_file,
            tls_ca_file=s.tls_ca_file,
            tls_cert_file=s.tls_cert_file,
            tls_key_file=s.tls_key_file,
        )

    def wants_tls(self, server_info: dict[str, object]) -> bool:
        """TLS when the URL asks for it or the server requires it (its INFO says so)."""
        return self.tls or bool(server_info.get("tls_required"))

    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the server against the CA file (or the system's CAs); a client certificate
        when one is configured (servers with ``verify: true``)."""
        try:
            ctx = ssl.create_default_context(cafile=self.tls_ca_file)
            if self.tls_cert_file:
                ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"TLS files: {exc}") from exc
        return ctx

    def connect_auth(self, nonce: str) -> dict[str, object]:
        """The CONNECT fields that authenticate this leaf (``nonce`` is from the server's INFO)."""
        opts: dict[str, object] = {}
        if self.user:
            opts["user"], opts["pass"] = self.user, self.password or ""
        if self.token:
            opts["auth_token"] = self.token
        if self.creds_file:
            jwt, seed = read_creds(self.creds_file)
            opts["jwt"] = jwt
            opts["sig"] = _sign(seed, nonce)
        elif self.nkey_seed_file:
            seed = _read(self.nkey_seed_file).strip()
            opts["nkey"] = _public_key(seed)
            opts["sig"] = _sign(seed, nonce)
        return opts


def read_creds(path: str) -> tuple[str, str]:
    """The user JWT and the nkey seed from a ``.creds`` file (the format ``nsc`` writes)."""
    blocks = [b.strip() for b in _CREDS_BLOCK.findall(_read(path))]
    if len(blocks) < 2:
        raise CredentialsError(f"{path}: expected a JWT block and a seed block")
    return blocks[0], blocks[1]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise CredentialsError(f"{path}: {exc}") from exc


def _keypair(seed: str):  # type: ignore[no-untyped-def]
    import nkeys

    try:
        return nkeys.from_seed(seed.encode())
    except Exception as exc:  # nkeys raises its own error classes for every kind of bad seed
        raise CredentialsError(f"bad nkey seed: {exc}") from exc


def _sign(seed: str, nonce: str) -> str:
    sig = _keypair(seed).sign(nonce.encode())
    return base64.urlsafe_b64encode(sig).decode().rstrip("=")


def _public_key(seed: str) -> str:
    return str(_keypair(seed).public_key.decode())


@dataclass(frozen=True)
class SubscribePermissions:
    """What the hub lets this leaf subscribe to: the ``import`` of the INFO it sends after CONNECT.

    The hub closes a leaf link that asks for a subject outside them ("Subscription Violation",
    then "Protocol Violation"), so one stream on a forbidden subject would take the whole gateway
    offline on every reconnect; the gateway asks only for what it may have. Mirrors the server's
    check for leaf links: a literal must be matched by an allow entry, a wildcard may also be wider
    than one (the hub prunes what it forwards), and no deny entry may match.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def from_info(cls, info: dict[str, object]) -> SubscribePermissions:
        perms = info.get("import")
        if not isinstance(perms, dict):
            return cls()
        return cls(tuple(perms.get("allow") or ()), tuple(perms.get("deny") or ()))

    def allows(self, subject: str) -> bool:
        wild = "*" in subject or ">" in subject
        if self.allow and not any(
            subject_matches(p, subject) or (wild and subjects_overlap(subject, p)) for p in self.allow
        ):
            return False
        return not any(subject_matches(p, subject) for p in self.deny)
