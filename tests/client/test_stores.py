"""The memory-stores client is the anthropic SDK, built from the client's settings."""

from __future__ import annotations

import anthropic
import pytest
from project_memory_client import Settings
from project_memory_client.stores import anthropic_client

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


def test_the_sdk_built_from_the_settings_reaches_this_servers_stores(
    pm_server: Server, writer: str
) -> None:
    stores = anthropic_client(Settings(url=pm_server.url, token=writer), max_retries=0)
    store = stores.beta.memory_stores.create(name="From the settings")
    stores.beta.memory_stores.memories.create(store.id, path="/a.md", content="hello")
    full = list(stores.beta.memory_stores.memories.list(store.id, view="full"))
    assert [(m.path, m.content) for m in full] == [("/a.md", "hello")]
    # An admin token of another tenant reaches acme/web through the settings' scope headers.
    admin = pm_server.token("admin", tenant="default", project="default")
    scoped = anthropic_client(
        Settings(url=pm_server.url, token=admin, tenant="acme", project="web"), max_retries=0
    )
    assert scoped.beta.memory_stores.retrieve(store.id).name == "From the settings"
    unscoped = anthropic_client(Settings(url=pm_server.url, token=admin), max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        unscoped.beta.memory_stores.retrieve(store.id)
