"""Credentials for tests, made without ``nsc``: nkeys, operator/account/user JWTs, ``.creds`` files,
and a throw-away CA with a server and a client certificate for TLS."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
UNLIMITED_USER = {"subs": -1, "data": -1, "payload": -1}


@dataclass(frozen=True)
class Key:
    seed: str

    @classmethod
    def new(cls, prefix: int) -> Key:
        return cls(nkeys.encode_seed(os.urandom(32), prefix).decode())

    @property
    def public(self) -> str:
        return str(nkeys.from_seed(self.seed.encode()).public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(self.seed.encode()).sign(data))


def operator_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_OPERATOR)


def account_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_ACCOUNT)


def user_key() -> Key:
    return Key.new(nkeys.PREFIX_BYTE_USER)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode_jwt(issuer: Key, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS v2 JWT: ed25519-nkey signature by ``issuer`` over header.claims; ``jti`` is the
    SHA-512/256 of the claims, base32, as the jwt library computes it."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    digest = hashlib.new("sha512_256", json.dumps(claims).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signing_input = f"{header}.{body}".encode()
    return f"{header}.{body}.{_b64(issuer.sign(signing_input))}"


def operator_jwt(op: Key) -> str:
    return encode_jwt(op, op.public, "OP", {"type": "operator"})


def account_jwt(op: Key, acc: Key, name: str, mappings: dict[str, str] | None = None) -> str:
    nats: dict[str, Any] = {"type": "account", "limits": UNLIMITED_ACCOUNT}
    if mappings:
        nats["mappings"] = {src: [{"subject": dst, "weight": 100}] for src, dst in mappings.items()}
    return encode_jwt(op, acc.public, name, nats)


def user_jwt(acc: Key, user: Key, name: str, permissions: dict[str, Any] | None = None) -> str:
    return encode_jwt(acc, user.public, name, {"type": "user", **UNLIMITED_USER, **(permissions or {})})


def write_creds(path: Path, jwt: str, user: Key) -> Path:
    """The ``.creds`` layout nsc writes: the user JWT, then the user's seed."""
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed}\n"
        "------END USER NKEY SEED------\n"
    )
    return path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def make_tls(workdir: Path) -> TlsFiles:
    """A self-signed CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    now = datetime.datetime.now(datetime.UTC)

    def cert(
        subject: str,
        key: ec.EllipticCurvePrivateKey,
        issuer: x509.Name | None,
        issuer_key: ec.EllipticCurvePrivateKey,
        ca: bool,
        san: bool,
    ) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            import ipaddress

            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    def save(name: str, c: x509.Certificate, k: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
        cp, kp = workdir / f"{name}.pem", workdir / f"{name}-key.pem"
        cp.write_bytes(c.public_bytes(serialization.Encoding.PEM))
        kp.write_bytes(
            k.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cp, kp

    workdir.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = cert("jetlake test CA", ca_key, None, ca_key, ca=True, san=False)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = cert("127.0.0.1", srv_key, ca_cert.subject, ca_key, ca=False, san=True)
    cli_key = ec.generate_private_key(ec.SECP256R1())
    cli_cert = cert("jetlake gateway", cli_key, ca_cert.subject, ca_key, ca=False, san=False)
    ca_path, _ = save("ca", ca_cert, ca_key)
    srv_path, srv_key_path = save("server", srv_cert, srv_key)
    cli_path, cli_key_path = save("client", cli_cert, cli_key)
    return TlsFiles(ca_path, srv_path, srv_key_path, cli_path, cli_key_path)
