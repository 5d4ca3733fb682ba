"""Who an OAuth client is: a Client ID Metadata Document fetched from its https URL, or a
client registered here (RFC 7591), and the rules its redirect URIs are held to.

CIMD fetches are the server reaching out on a stranger's word, so each is guarded:

* the host's every address must be public (no private, loopback, link-local, multicast or
  reserved range) unless ``MEMORY_OAUTH_CIMD_PRIVATE`` allows them, and the connection goes
  to the address that was checked (a second lookup could answer differently);
* https only, certificates checked (``MEMORY_OAUTH_CIMD_CA_FILE`` adds an intranet CA), no
  redirects followed;
* at most :data:`MAX_DOCUMENT_BYTES`, within :data:`FETCH_SECONDS` in all;
* the answer is cached as its ``Cache-Control`` says (``no-store``: not at all), at most a
  day, and :data:`CACHE_ENTRIES` documents per worker.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from http.client import HTTPResponse
from urllib.parse import urlsplit

from authlib.oauth2.rfc6749 import ClientMixin

from app.storage.core.oauth import GRANT_TYPES, Client

SCOPE = "memory"
MAX_DOCUMENT_BYTES = 64 << 10
FETCH_SECONDS = 5.0
DEFAULT_CACHE_SECONDS = 300
MAX_CACHE_SECONDS = 86400
CACHE_ENTRIES = 256
LOOPBACK_REDIRECT_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
# Schemes a redirect may never use: they run or read in the browser itself.
FORBIDDEN_SCHEMES = frozenset({"javascript", "data", "file", "vbscript", "blob", "about"})
# Where claude.ai's and Claude Desktop's connectors come back to (docs/connectors.md).
CLAUDE_CALLBACKS = (
    "https://claude.ai/api/mcp/auth_callback",
    "https://claude.com/api/mcp/auth_callback",
)


class ClientError(ValueError):
    """A client id, document or registration this server refuses, and why."""


@dataclass(frozen=True, slots=True)
class OAuthClient(ClientMixin):  # type: ignore[misc]
    """The client as authlib asks about it."""

    client_id: str
    client_name: str
    redirect_uris: tuple[str, ...]
    auth_method: str = "none"
    record: Client | None = None

    @property
    def is_document(self) -> bool:
        return self.client_id.startswith("https://")

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        # A redirect_uri is always required: a client may name several.
        return None

    def get_allowed_scope(self, scope: str) -> str:
        return SCOPE

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return any(redirect_matches(redirect_uri, known) for known in self.redirect_uris)

    def check_client_secret(self, client_secret: str) -> bool:
        return self.record is not None and self.record.check_secret(client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == self.auth_method

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in GRANT_TYPES


def redirect_matches(asked: str, registered: str) -> bool:
    """Exactly, except that a loopback http redirect matches on any port (RFC 8252 §7.3): a
    CLI listens wherever the system gives it a port."""
    if asked == registered:
        return True
    a, r = urlsplit(asked), urlsplit(registered)
    if a.scheme != "http" or r.scheme != "http":
        return False
    if not (_loopback(a.netloc) and _loopback(r.netloc)):
        return False
    return (a.hostname, a.path, a.query) == (r.hostname, r.path, r.query) and not a.fragment


def _loopback(netloc: str) -> bool:
    host = netloc.rsplit("@", 1)[-1]
    name = host[: host.find("]") + 1] if host.startswith("[") else host.split(":", 1)[0]
    return name.lower() in LOOPBACK_REDIRECT_HOSTS


def check_redirect_uri(uri: str) -> str:
    """A redirect URI a client may register: https, loopback http, or an app's own scheme
    (RFC 8252 §7.1); ClientError otherwise."""
    if not isinstance(uri, str) or not uri or len(uri) > 2048:
        raise ClientError("a redirect URI must be a string of at most 2048 characters")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.fragment or "#" in uri:
        raise ClientError(f"redirect URI {uri[:200]} has a fragment")
    if scheme == "https":
        if not parts.hostname:
            raise ClientError(f"redirect URI {uri[:200]} has no host")
        return uri
    if scheme == "http":
        if not _loopback(parts.netloc):
            raise ClientError(
                f"redirect URI {uri[:200]}: plain http is allowed for localhost and 127.0.0.1 only"
            )
        return uri
    if not scheme or scheme in FORBIDDEN_SCHEMES:
        raise ClientError(f"redirect URI {uri[:200]} has no usable scheme")
    return uri


# RFC 7591 fields this server reads, and the JSON type each must have.
REGISTRATION_FIELDS: dict[str, type] = {
    "redirect_uris": list,
    "client_name": str,
    "client_uri": str,
    "token_endpoint_auth_method": str,
    "grant_types": list,
    "response_types": list,
    "scope": str,
    "contacts": list,
    "logo_uri": str,
    "tos_uri": str,
    "policy_uri": str,
    "software_id": str,
    "software_version": str,
}


def check_registration(body: object) -> None:
    """The shape of a registration request, before the library reads it: an object whose
    known fields have their JSON types (a list of strings for the lists); ClientError."""
    if not isinstance(body, dict):
        raise ClientError("the registration must be a JSON object")
    for name, kind in REGISTRATION_FIELDS.items():
        if name not in body:
            continue
        value = body[name]
        if not isinstance(value, kind):
            raise ClientError(f"{name} must be a {'list' if kind is list else 'string'}")
        if isinstance(value, list) and not all(isinstance(item, str) for item in value):
            raise ClientError(f"{name} must be a list of strings")
    if not body.get("redirect_uris"):
        raise ClientError("redirect_uris: at least one redirect URI is required")


def registered_client(record: Client) -> OAuthClient:
    return OAuthClient(
        client_id=record.client_id,
        client_name=record.client_name or record.client_id,
        redirect_uris=record.redirect_uris,
        auth_method=record.token_endpoint_auth_method,
        record=record,
    )


# -- Client ID Metadata Documents -----------------------------------------------------------
def check_document_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port out of range, a bracket unclosed
        raise ClientError(f"the client id is not a URL ({exc})") from None
    if port == 0 or any(ord(ch) < 0x21 or ord(ch) > 0x7E for ch in url):
        raise ClientError("a client id URL must be plain ASCII, with no spaces or controls")
    if parts.scheme != "https" or not parts.hostname or len(url) > 2048:
        raise ClientError("a client id URL must be https with a host")
    if parts.path in ("", "/") or parts.fragment or parts.username or parts.password:
        raise ClientError("a client id URL needs a path, and no fragment or credentials")
    if "/./" in parts.path or "/../" in parts.path:
        raise ClientError("a client id URL may not hold dot segments")


class DocumentCache:
    """Fetched documents by URL, each until its cache lifetime ends (one per worker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, OAuthClient]] = OrderedDict()

    def get(self, url: str) -> OAuthClient | None:
        with self._lock:
            found = self._entries.get(url)
            if found is None:
                return None
            if found[0] <= time.monotonic():
                del self._entries[url]
                return None
            self._entries.move_to_end(url)
            return found[1]

    def put(self, url: str, client: OAuthClient, seconds: int) -> None:
        if seconds <= 0:
            return
        with self._lock:
            self._entries[url] = (time.monotonic() + seconds, client)
            self._entries.move_to_end(url)
            while len(self._entries) > CACHE_ENTRIES:
                self._entries.popitem(last=False)


def document_client(
    url: str, cache: DocumentCache, *, allow_private: bool, ca_file: str
) -> OAuthClient:
    """The client whose id is the URL ``url``, from its cached or fetched document."""
    check_document_url(url)
    found = cache.get(url)
    if found is not None:
        return found
    body, cache_seconds = fetch_document(url, allow_private=allow_private, ca_file=ca_file)
    client = parse_document(url, body)
    cache.put(url, client, cache_seconds)
    return client


def parse_document(url: str, body: bytes) -> OAuthClient:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ClientError("the client metadata document is not JSON") from None
    if not isinstance(doc, dict):
        raise ClientError("the client metadata document is not a JSON object")
    if doc.get("client_id") != url:
        raise ClientError("the client metadata document's client_id is not its own URL")
    method = doc.get("token_endpoint_auth_method", "none")
    if method != "none" or "client_secret" in doc:
        raise ClientError("a client metadata document describes a public client: no secret")
    uris = doc.get("redirect_uris")
    if not isinstance(uris, list) or not uris or len(uris) > 20:
        raise ClientError("the client metadata document needs 1 to 20 redirect_uris")
    redirects = tuple(check_redirect_uri(u) for u in uris)
    name = doc.get("client_name")
    if name is not None and not isinstance(name, str):
        raise ClientError("client_name must be a string")
    return OAuthClient(
        client_id=url,
        client_name=(name or urlsplit(url).hostname or url)[:200],
        redirect_uris=redirects,
    )


def fetch_document(url: str, *, allow_private: bool, ca_file: str) -> tuple[bytes, int]:
    """The body of ``url`` and how long it may be cached, by the guards above."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 443
    deadline = time.monotonic() + FETCH_SECONDS
    address = _checked_address(host, port, allow_private)
    context = ssl.create_default_context(cafile=ca_file or None)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        raw = socket.create_connection((address, port), timeout=FETCH_SECONDS)
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.settimeout(max(0.1, deadline - time.monotonic()))
            netloc = host if port == 443 else f"{host}:{port}"
            request = (
                f"GET {target} HTTP/1.1\r\nHost: {netloc}\r\nAccept: application/json\r\n"
                "User-Agent: project-memory\r\nConnection: close\r\n\r\n"
            )
            tls.sendall(request.encode("ascii", "strict"))
            response = HTTPResponse(tls)
            response.begin()
            if response.status != 200:
                raise ClientError(
                    f"the client metadata document answered HTTP {response.status} (redirects"
                    " are not followed)"
                )
            body = b""
            while len(body) <= MAX_DOCUMENT_BYTES:
                if time.monotonic() > deadline:
                    raise ClientError("the client metadata document took too long to arrive")
                chunk = response.read(16 << 10)
                if not chunk:
                    break
                body += chunk
            if len(body) > MAX_DOCUMENT_BYTES:
                raise ClientError(
                    f"the client metadata document is larger than {MAX_DOCUMENT_BYTES} bytes"
                )
            return body, cache_seconds(response.getheader("Cache-Control"))
    except ClientError:
        raise
    except UnicodeEncodeError:
        raise ClientError("the client id URL is not plain ASCII") from None
    except (OSError, ValueError) as exc:
        raise ClientError(f"the client metadata document could not be fetched: {exc}") from None


def _checked_address(host: str, port: int, allow_private: bool) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:
        raise ClientError(f"the client id's host {host[:100]} does not resolve ({exc})") from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise ClientError(f"the client id's host {host[:100]} has no address")
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not allow_private and not ip.is_global:
            raise ClientError(
                f"the client id's host {host[:100]} resolves to {ip}, a private, loopback or"
                " reserved address: not fetched"
            )
    return addresses[0]


def cache_seconds(header: str | None) -> int:
    """How long a document may be kept, from its ``Cache-Control``."""
    if header is None:
        return DEFAULT_CACHE_SECONDS
    directives = [d.strip().lower() for d in header.split(",")]
    if "no-store" in directives or "no-cache" in directives:
        return 0
    for directive in directives:
        name, _, value = directive.partition("=")
        if name.strip() == "max-age" and value.strip().isdigit():
            return min(int(value.strip()), MAX_CACHE_SECONDS)
    return DEFAULT_CACHE_SECONDS
