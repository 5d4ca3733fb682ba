"""GET /sandbox/memory/v1/whoami: the token's id, name, role and scope, never its secret."""

from __future__ import annotations

import json

import yaml
from flask import Flask
from flask.testing import FlaskClient

from app.storage.core.users import User, user_id
from tests.conftest import Tokens

PM = "/sandbox/memory/v1"


def test_whoami_names_the_token_and_the_scope_it_acts_in(
    client: FlaskClient, tokens: Tokens
) -> None:
    r = client.get(f"{PM}/whoami", headers=tokens.headers("writer"))
    assert r.status_code == 200, r.data
    body = r.get_json()
    assert body == {
        "token_id": tokens.ids["writer"],
        "name": body["name"],
        "role": "writer",
        "tenant": "acme",
        "project": "web",
        "visibility": "project",
        "user": None,
        "user_name": None,
        "token_tenant": "acme",
        "token_project": "web",
        "created_at": body["created_at"],
        "expires_at": None,
    }
    assert tokens.secrets["writer"] not in json.dumps(body)
    # A tenant_admin naming a project acts there; its own project is none.
    r = client.get(
        f"{PM}/whoami", headers=tokens.headers("tenant_admin", **{"X-Sandbox-Project-Id": "mobile"})
    )
    assert r.status_code == 200, r.data
    got = r.get_json()
    assert (got["role"], got["tenant"], got["project"]) == ("tenant_admin", "acme", "mobile")
    assert got["token_project"] is None


def test_whoami_needs_a_token_and_keeps_the_scope_rules(
    client: FlaskClient, tokens: Tokens
) -> None:
    assert client.get(f"{PM}/whoami").status_code == 401
    r = client.get(
        f"{PM}/whoami", headers=tokens.headers("writer", **{"X-Sandbox-Project-Id": "mobile"})
    )
    assert r.status_code == 403


def test_whoami_is_in_the_openapi_document_marked_beyond_the_seed(client: FlaskClient) -> None:
    spec = yaml.safe_load(client.get(f"{PM}/openapi.yaml").data)
    op = spec["paths"][f"{PM}/whoami"]["get"]
    assert op["operationId"] == "get_whoami"
    assert "Beyond the seed" in op["description"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/WhoAmI"
    }
    assert "token_id" in spec["components"]["schemas"]["WhoAmI"]["properties"]


def test_whoami_names_the_user_behind_a_token_and_the_space_it_acts_in(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    """A person's token: whoami names them ("ana via laptop"), and in their private space
    says so by the visibility, the project being the team's (a private space's own name is
    never given out)."""
    storage = app.extensions["storage"]
    ana = user_id("https://idp.example", "ana")
    storage.users.change(
        ana,
        lambda _: User(
            ana,
            "https://idp.example",
            "ana",
            "ana@example.com",
            "Ana",
            "2026-01-01",
            role="writer",
            tenant="acme",
            project="web",
        ),  # fmt: skip
    )
    tokens.add("ana", role="writer", tenant="acme", project="web", user=ana)
    body = client.get(f"{PM}/whoami", headers=tokens.headers("ana")).get_json()
    assert (body["user"], body["user_name"], body["visibility"]) == (ana, "Ana", "project")
    private = client.get(f"{PM}/whoami?visibility=private", headers=tokens.headers("ana"))
    assert private.get_json()["visibility"] == "private"
    assert private.get_json()["project"] == "web"
