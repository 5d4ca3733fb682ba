"""The memory-stores API (``/v1/memory_stores``) through the official ``anthropic`` SDK.

The server speaks that API wire-compatibly, so its client is the SDK itself, pointed at the
server with the same settings as :class:`~project_memory_client.Client`::

    from project_memory_client.stores import anthropic_client

    stores = anthropic_client().beta.memory_stores  # PROJECT_MEMORY_URL, _TOKEN, ...
    store = stores.create(name="Team prefs")
    stores.memories.create(store.id, path="/prefs/format.md", content="Use ruff format.")

Needs the ``sdk`` extra: ``pip install 'project-memory-client[sdk]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SettingsError
from .settings import PROJECT_HEADER, TENANT_HEADER, Settings, load_settings

if TYPE_CHECKING:
    import anthropic

__all__ = ["anthropic_client", "async_anthropic_client"]


def _sdk_client(kind: str, settings: Settings | None, scope: dict[str, Any], kwargs: Any) -> Any:
    """``anthropic.<kind>`` pointed at the server: base URL, token (as x-api-key, which the
    server takes like a bearer token), tenant/project headers and timeout from the settings."""
    try:
        import anthropic
    except ImportError:
        raise SettingsError(
            "the memory-stores client is the anthropic SDK: pip install"
            " 'project-memory-client[sdk]'"
        ) from None
    s = (settings or load_settings()).with_overrides(**scope).require()
    headers = {}
    if s.tenant:
        headers[TENANT_HEADER] = s.tenant
    if s.project:
        headers[PROJECT_HEADER] = s.project
    options = {
        "base_url": s.url,
        "api_key": s.token,
        "default_headers": headers,
        "timeout": s.timeout,
    }
    return getattr(anthropic, kind)(**{**options, **kwargs})


def anthropic_client(
    settings: Settings | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    project: str | None = None,
    **kwargs: Any,
) -> anthropic.Anthropic:
    """An ``anthropic.Anthropic`` whose ``beta.memory_stores`` is this server's.

    ``settings`` (else the environment and the config file) give the URL, token and scope;
    the keyword arguments override them; ``kwargs`` go to the SDK (``max_retries``, ...).
    """
    scope = {"url": url, "token": token, "tenant": tenant, "project": project}
    client: anthropic.Anthropic = _sdk_client("Anthropic", settings, scope, kwargs)
    return client


def async_anthropic_client(
    settings: Settings | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    tenant: str | None = None,
    project: str | None = None,
    **kwargs: Any,
) -> anthropic.AsyncAnthropic:
    """The same for ``anthropic.AsyncAnthropic``."""
    scope = {"url": url, "token": token, "tenant": tenant, "project": project}
    client: anthropic.AsyncAnthropic = _sdk_client("AsyncAnthropic", settings, scope, kwargs)
    return client
