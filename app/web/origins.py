"""Where the browser reached us: the scheme and the origin a request came to, and the origin
a state-changing form must come from (the console's POST guard calls :func:`is_our_origin`).

Proxy headers (``X-Forwarded-Proto``, ``X-Forwarded-Host``) are believed only from the
``MEMORY_TRUSTED_PROXIES`` proxies in front, the value the outermost of them set; gunicorn
itself believes none (gunicorn.conf.py), so this is the one place that decides.
``MEMORY_PUBLIC_URL``, when set, is the one origin forms are accepted from: a request's own
``Host`` is the client's to choose.
"""

from __future__ import annotations

from ipaddress import ip_address
from urllib.parse import urlsplit

from flask import current_app, request


def public_origin(url: str) -> str:
    """``url`` as an origin (``scheme://host[:port]``); ValueError for a URL that is not
    an http(s) origin (a path, query or credentials in it, or no host)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError("must be an origin: scheme, host and port only")
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    return f"{parts.scheme}://{host}"


def from_trusted_proxy() -> bool:
    """Whether this request's peer is one of the proxies ``MEMORY_TRUSTED_PROXIES`` lists by
    address (False when it gives a count: then no peer is known to be the proxy)."""
    nets = current_app.config.get("TRUSTED_PROXY_NETS") or ()
    try:
        peer = ip_address((request.remote_addr or "").split("%", 1)[0])
    except ValueError:
        return False  # a unix socket's peer: no address to hold to the list
    return any(peer in net for net in nets)


def forwarded(header: str) -> str | None:
    """The value the outermost trusted proxy set; None without trusted proxies (or from a
    peer not among the addresses they are listed by)."""
    trusted: int = current_app.config["TRUSTED_PROXIES"]
    if trusted < 1:
        return None
    if current_app.config.get("TRUSTED_PROXY_NETS") and not from_trusted_proxy():
        return None
    values = [v.strip() for v in request.headers.get(header, "").split(",") if v.strip()]
    return values[-trusted] if len(values) >= trusted else None


def https() -> bool:
    """Whether the browser talks to us over TLS (directly, or to a trusted proxy)."""
    if request.is_secure:
        return True
    proto = forwarded("X-Forwarded-Proto")
    return proto is not None and proto.strip().lower() == "https"


def request_origin() -> str:
    """The origin this request was sent to, as the browser saw it."""
    host = forwarded("X-Forwarded-Host") or request.host
    return f"{'https' if https() else 'http'}://{host}"


def is_our_origin(origin: str) -> bool:
    """Whether a page of ``origin`` is one of ours: ``MEMORY_PUBLIC_URL``'s origin when it is
    set, else the origin the request itself was sent to."""
    configured: str = current_app.config.get("PUBLIC_URL", "")
    if configured:
        return origin == public_origin(configured)
    return origin == request_origin()
