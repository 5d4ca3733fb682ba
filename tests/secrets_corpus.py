"""Real-format secrets, made up: valid shapes and checksums, for planting in any write path.

``corpus(seed)`` gives :class:`Planted` secrets of every kind the scanner must find (at least
15 of each): ``text`` is how the secret reads where people paste it (an assignment, a URL, a
header, a bare token), ``value`` the part that must not survive masking, ``kind`` the
marker's word. Deterministic for a seed; private keys come from ``cryptography``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import random
import string
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
BASE32 = string.ascii_uppercase + "234567"
PER_KIND = 15
# Kinds that are one token (no name or user kept beside them): also planted encoded.
TOKEN_KINDS = (
    "github-token",
    "gitlab-token",
    "slack-token",
    "stripe-key",
    "openai-key",
    "anthropic-key",
    "google-api-key",
    "aws-access-key",
    "jwt",
    "project-memory-token",
    "npm-token",
    "pypi-token",
    "huggingface-token",
    "sendgrid-api-token",
)


@dataclass(frozen=True)
class Planted:
    kind: str
    text: str
    value: str

    def __repr__(self) -> str:  # a failing test names the kind, not the made-up secret
        return f"Planted({self.kind!r})"


def _pick(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def base62_crc32(body: str) -> str:
    """The checksum GitHub (and npm) end their tokens with: CRC32 in base62, 6 digits."""
    n = binascii.crc32(body.encode())
    out = ""
    while n:
        n, r = divmod(n, 62)
        out = BASE62[r] + out
    return out.rjust(6, "0")


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def github(rng: random.Random) -> Planted:
    prefix = rng.choice(["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"])
    if prefix == "github_pat_":
        token = prefix + _pick(rng, ALNUM, 22) + "_" + _pick(rng, ALNUM, 59)
    else:
        body = _pick(rng, ALNUM, 30)
        token = prefix + body + base62_crc32(body)
    return Planted("github-token", token, token)


def gitlab(rng: random.Random) -> Planted:
    token = "glpat-" + _pick(rng, URLSAFE, 20)
    return Planted("gitlab-token", token, token)


def slack(rng: random.Random) -> Planted:
    digits = string.digits
    shape = rng.randrange(3)
    if shape == 0:
        token = f"xoxb-{_pick(rng, digits, 12)}-{_pick(rng, digits, 13)}-{_pick(rng, ALNUM, 24)}"
    elif shape == 1:
        ids = "-".join(_pick(rng, digits, 12) for _ in range(3))
        token = f"xoxp-{ids}-{_pick(rng, string.hexdigits.lower()[:16], 32)}"
    else:
        token = f"xapp-1-A{_pick(rng, BASE32, 10)}-{_pick(rng, digits, 13)}-{_pick(rng, '0123456789abcdef', 64)}"
    return Planted("slack-token", token, token)


def slack_webhook(rng: random.Random) -> Planted:
    path = f"T{_pick(rng, BASE32, 8)}/B{_pick(rng, BASE32, 10)}/{_pick(rng, ALNUM, 24)}"
    return Planted("slack-webhook", f"https://hooks.slack.com/services/{path}", path)


def stripe(rng: random.Random) -> Planted:
    token = rng.choice(["sk_live_", "sk_test_", "rk_live_"]) + _pick(
        rng, ALNUM, rng.choice([24, 99])
    )
    return Planted("stripe-key", token, token)


def openai(rng: random.Random) -> Planted:
    shape = rng.randrange(3)
    if shape == 0:
        token = f"sk-proj-{_pick(rng, URLSAFE, 74)}T3BlbkFJ{_pick(rng, URLSAFE, 74)}"
    elif shape == 1:
        token = f"sk-{_pick(rng, ALNUM, 20)}T3BlbkFJ{_pick(rng, ALNUM, 20)}"
    else:
        token = "sk-" + _pick(rng, ALNUM, 48)
    return Planted("openai-key", token, token)


def anthropic(rng: random.Random) -> Planted:
    token = f"sk-ant-{rng.choice(['api03', 'admin01'])}-{_pick(rng, URLSAFE, 93)}AA"
    return Planted("anthropic-key", token, token)


def google(rng: random.Random) -> Planted:
    token = "AIza" + _pick(rng, URLSAFE, 35)
    return Planted("google-api-key", token, token)


def aws_key_id(rng: random.Random) -> Planted:
    token = rng.choice(["AKIA", "ASIA"]) + _pick(rng, BASE32, 16)
    return Planted("aws-access-key", token, token)


def aws_secret(rng: random.Random) -> Planted:
    secret = _pick(rng, ALNUM + "+/", 40)
    key_id = "AKIA" + _pick(rng, BASE32, 16)
    text = rng.choice(
        [
            f"aws_access_key_id = {key_id}\naws_secret_access_key = {secret}",
            f"export AWS_ACCESS_KEY_ID={key_id}\nexport AWS_SECRET_ACCESS_KEY={secret}",
        ]
    )
    return Planted("aws-secret-key", text, secret)


def jwt(rng: random.Random) -> Planted:
    header = {"alg": "HS256", "typ": "JWT"}
    payload = {"sub": str(rng.randrange(10**9)), "name": _pick(rng, ALNUM, 8), "iat": 1700000000}
    signing = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(payload).encode())
    key = rng.randbytes(32)
    token = signing + "." + _b64url(hmac.new(key, signing.encode(), hashlib.sha256).digest())
    return Planted("jwt", token, token)


@cache
def _pem(n: int) -> str:
    """A real private key in PEM (its own per ``n``; cached, key generation takes time)."""
    pick = n % 4
    if pick == 0:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        fmt = serialization.PrivateFormat.TraditionalOpenSSL
    elif pick == 1:
        key = ec.generate_private_key(ec.SECP256R1())  # type: ignore[assignment]
        fmt = serialization.PrivateFormat.PKCS8
    elif pick == 2:
        key = ed25519.Ed25519PrivateKey.generate()  # type: ignore[assignment]
        fmt = serialization.PrivateFormat.OpenSSH
    else:
        key = ec.generate_private_key(ec.SECP384R1())  # type: ignore[assignment]
        fmt = serialization.PrivateFormat.TraditionalOpenSSL
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()).decode()


def private_key(rng: random.Random) -> Planted:
    pem = _pem(rng.randrange(8))
    lines = pem.strip().splitlines()
    body = max(lines[1:-1], key=len)
    if rng.random() < 0.35:  # cut before its END, as a paste or a truncated log leaves it
        pem = "\n".join(lines[: max(2, len(lines) // 2)])
    return Planted("private-key", pem, body)


def url_password(rng: random.Random) -> Planted:
    password = _pick(rng, ALNUM + "!*~", rng.randrange(10, 24))
    scheme, user = rng.choice(
        [("postgres", "app"), ("mysql", "root"), ("redis", ""), ("amqp", "guest"), ("https", "ci")]
    )
    host = rng.choice(["db.internal", "10.0.3.7", "cache.example.net"])
    return Planted("url-password", f"{scheme}://{user}:{password}@{host}:5432/main", password)


def curl_user(rng: random.Random) -> Planted:
    password = _pick(rng, ALNUM, 16)
    flag = rng.choice(["-u ", "--user ", "--user="])
    text = f"curl -sS {flag}deploy:{password} https://ci.example.net/api/json"
    return Planted("url-password", text, password)


def assignment(rng: random.Random) -> Planted:
    value = _pick(rng, ALNUM + "-_", rng.randrange(16, 40))
    name = rng.choice(
        ["DB_PASSWORD", "SESSION_SECRET", "API_TOKEN", "PASSWORD", "STRIPE_WEBHOOK_SECRET"]
    )
    text = rng.choice([f"{name}={value}", f'{name}="{value}"', f"export {name}={value}"])
    return Planted("secret-assignment", text, value)


def pm_token(rng: random.Random) -> Planted:
    token = "pm_" + _b64url(rng.randbytes(32))
    return Planted("project-memory-token", token, token)


def npm(rng: random.Random) -> Planted:
    body = _pick(rng, ALNUM, 30)
    token = "npm_" + body + base62_crc32(body)
    return Planted("npm-token", token, token)


def pypi(rng: random.Random) -> Planted:
    token = "pypi-AgEIcHlwaS5vcmc" + _b64url(rng.randbytes(rng.randrange(60, 140)))
    return Planted("pypi-token", token, token)


def huggingface(rng: random.Random) -> Planted:
    token = "hf_" + _pick(rng, string.ascii_letters, 34)
    return Planted("huggingface-token", token, token)


def bearer(rng: random.Random) -> Planted:
    value = _b64url(rng.randbytes(24))
    return Planted("bearer-token", f"Authorization: Bearer {value}", value)


def basic(rng: random.Random) -> Planted:
    value = base64.b64encode(f"deploy:{_pick(rng, ALNUM, 14)}".encode()).decode()
    return Planted("basic-auth", f"Authorization: Basic {value}", value)


def sendgrid(rng: random.Random) -> Planted:
    token = f"SG.{_pick(rng, URLSAFE, 22)}.{_pick(rng, URLSAFE, 43)}"
    return Planted("sendgrid-api-token", token, token)


MAKERS: tuple[Callable[[random.Random], Planted], ...] = (
    github,
    gitlab,
    slack,
    slack_webhook,
    stripe,
    openai,
    anthropic,
    google,
    aws_key_id,
    aws_secret,
    jwt,
    private_key,
    url_password,
    curl_user,
    assignment,
    pm_token,
    npm,
    pypi,
    huggingface,
    bearer,
    basic,
    sendgrid,
)


def corpus(seed: int = 7, per_kind: int = PER_KIND) -> list[Planted]:
    """``per_kind`` secrets from each maker, the same for the same seed."""
    rng = random.Random(seed)
    return [make(rng) for make in MAKERS for _ in range(per_kind)]


def json_escaped(planted: Planted, rng: random.Random) -> str:
    """The secret as a transcript line holds it: JSON text after a ``\\n`` or ``\\t``, or in
    quotes of its own."""
    shape = rng.randrange(3)
    if shape == 0:
        inner = f"output:\n{planted.text}\ndone"
    elif shape == 1:
        inner = f"cols\t{planted.text}\tend"
    else:
        return json.dumps({"type": "tool_result", "content": {"value": planted.text}})
    return json.dumps({"type": "tool_result", "content": inner})


def encoded(planted: Planted, how: str) -> str:
    """A token kind's secret base64- or hex-encoded, as a config or a log may carry it."""
    raw = planted.text.encode()
    if how == "base64":
        return "value: " + base64.b64encode(raw).decode()
    return "value: " + raw.hex()


# Files that hold made-up secrets on purpose (samples, fixtures, this corpus): masked rightly,
# so not counted as ordinary material.
SECRET_SAMPLES = (
    ":(exclude)tests/agents/test_secrets.py",
    ":(exclude)tests/secrets_corpus.py",
    ":(exclude)*secret_rules.json",
    ":(exclude)*secret_scan.py",
    ":(exclude)docs/secrets.md",
)


def ordinary_material(repo: Path, size: int = 2_200_000, seed: int = 11) -> str:
    """About ``size`` characters of what agents write that holds no secret: this repository's
    oldest history as ``git log -p`` (it never changes), its docs and sources as they are,
    and a generated log full of commit SHAs, SHA-256s, UUIDs and ULIDs."""
    parts: list[str] = [generated_log(seed, size // 4)]
    log = subprocess.run(
        ["git", "log", "-p", "--reverse", "--no-color", "--format=commit %H%n%an%n%n%B", "--", "."]
        + list(SECRET_SAMPLES),
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8", "replace")
    parts.append(log[: size // 2])
    for pattern in ("docs/*.md", "app/**/*.py", "client/src/**/*.py"):
        for path in sorted(repo.glob(pattern)):
            if path.name in {"secrets.md", "secret_scan.py"}:
                continue
            parts.append(path.read_text(encoding="utf-8"))
            if sum(map(len, parts)) >= size:
                return "\n".join(parts)[:size]
    return "\n".join(parts)[:size]


def generated_log(seed: int, size: int) -> str:
    """Log lines of ids and hashes: none of them is a secret."""
    rng = random.Random(seed)
    lines: list[str] = []
    total = 0
    while total < size:
        raw = rng.randbytes(32)
        sha1 = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        line = rng.choice(
            [
                f"commit {sha1}",
                f"2026-05-0{rng.randrange(1, 9)}T12:00:0{rng.randrange(10)}Z INFO request_id={uuid.UUID(bytes=raw[:16], version=4)} status=200",
                f"sha256:{hashlib.sha256(raw).hexdigest()}  artifact.tar.gz",
                f"record {ulid_of(raw)} stored at tasks/{ulid_of(raw[8:] + raw[:8])}.json",
                f'Merge: {sha1[:7]} {hashlib.sha1(raw[1:], usedforsecurity=False).hexdigest()[:12]} etag="{hashlib.md5(raw, usedforsecurity=False).hexdigest()}"',
                f"    {sha1[:12]} fix: keep the token's hash, sha={hashlib.sha256(raw[2:]).hexdigest()}",
            ]
        )
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid_of(raw: bytes) -> str:
    """A ULID's 26 characters from 16 bytes."""
    n = int.from_bytes(raw[:16], "big") >> 2
    return "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(26)))
