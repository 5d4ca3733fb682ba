"""GET /sandbox/memory/v1/whoami: the token's id, name, role and scope, never its secret."""

from __future__ import annotations

import json

import yaml
from flask.testing import FlaskClient

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
