"""Health checks, the per-request JSON log line, and Prometheus metrics (in-process and
in multiprocess mode under a real gunicorn)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.storage.tree.tokens import TokenRegistry
from tests.conftest import FixedClock, Tokens
from tests.e2e.conftest import start_server

API = "/sandbox/memory/v1"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    handler = _Lines()
    logger = logging.getLogger("app.request")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def test_health_and_readiness_need_no_credential_and_show_no_data(client: FlaskClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.get_json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200
    assert r.get_json()["status"] == "ok"
    assert set(r.get_json()) == {"status", "detail"}


def test_one_json_line_per_request_without_secret_or_body(
    client: FlaskClient, tokens: Tokens, log_lines: list[str]
) -> None:
    secret = tokens.secrets["writer"]
    body = {"meta": {"k": "v"}, "summary_md": "PRIVATE-SUMMARY-TEXT"}
    r = client.put(
        f"{API}/tasks/t1/turns/0",
        json=body,
        headers=tokens.headers("writer", **{"x-correlation-id": "corr-123"}),
    )
    assert r.status_code in (200, 201)
    assert len(log_lines) == 1
    line = log_lines[0]
    record = json.loads(line)
    assert record["correlation_id"] == "corr-123"
    assert record["method"] == "PUT"
    assert record["route"] == f"{API}/tasks/<task_id>/turns/<turn>"
    assert record["status"] == r.status_code
    assert record["tenant"] == "acme" and record["project"] == "web"
    assert record["token_id"] == tokens.ids["writer"]
    assert isinstance(record["duration_ms"], float)
    assert secret not in line and "PRIVATE-SUMMARY-TEXT" not in line


@pytest.mark.parametrize(
    ("who", "method", "headers", "tenant", "project"),
    [
        ("other_tenant", "GET", {"X-Sandbox-Tenant-Id": "acme"}, "globex", "web"),
        ("other_project", "GET", {"X-Sandbox-Project-Id": "web"}, "acme", "web"),
        ("writer", "GET", {"X-Sandbox-Project-Id": "mobile"}, "acme", "mobile"),
        ("reader", "PUT", {}, "acme", "web"),
    ],
)
def test_a_refused_scope_logs_the_tokens_tenant_and_the_requested_project(
    client: FlaskClient,
    tokens: Tokens,
    log_lines: list[str],
    who: str,
    method: str,
    headers: dict[str, str],
    tenant: str,
    project: str,
) -> None:
    resp = client.open(
        f"{API}/tasks/t/turns/0", method=method, json={}, headers=tokens.headers(who, **headers)
    )
    assert resp.status_code == 403
    (line,) = log_lines
    record = json.loads(line)
    assert record["status"] == 403 and record["token_id"] == tokens.ids[who]
    assert (record["tenant"], record["project"]) == (tenant, project)
    assert tokens.secrets[who] not in line


PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


@pytest.mark.parametrize(
    "sent",
    [
        "run-42",
        'eval run #7: "a" {b} <c> \\ ~',
        PRINTABLE,  # 95 characters: every one the rule allows
        "x" * 128,
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # a W3C traceparent
    ],
)
def test_a_correlation_id_within_the_rule_is_echoed_and_logged_verbatim(
    client: FlaskClient, tokens: Tokens, log_lines: list[str], sent: str
) -> None:
    headers = tokens.headers("writer", **{"x-correlation-id": sent})
    r = client.get(f"{API}/tasks", headers=headers)
    assert r.headers["x-correlation-id"] == sent
    missing = client.get("/v1/memory_stores/memstore_00000000000000000000000000", headers=headers)
    assert missing.status_code == 404
    assert missing.headers["x-correlation-id"] == sent
    assert missing.get_json()["request_id"] == missing.headers["request-id"] == f"req_{sent}"
    assert [json.loads(line)["correlation_id"] for line in log_lines] == [sent, sent]


@pytest.mark.parametrize(
    "sent",
    ["x" * 129, "a\x7fb", "tab\there", "caf\u00e9", "\u00ff" * 3, "a" * 5000],
)
def test_a_correlation_id_beyond_the_rule_is_replaced_and_the_replacement_logged(
    client: FlaskClient, tokens: Tokens, log_lines: list[str], sent: str
) -> None:
    r = client.get(f"{API}/tasks", headers=tokens.headers("writer", **{"x-correlation-id": sent}))
    assert r.status_code == 200
    new = r.headers["x-correlation-id"]
    assert new != sent and re.fullmatch("[0-9A-HJKMNP-TV-Z]{26}", new)
    replaced, request = (json.loads(line) for line in log_lines)
    assert replaced["event"] == "correlation_id_replaced"
    assert replaced["correlation_id"] == request["correlation_id"] == new
    assert replaced["length"] == len(sent) and replaced["supplied"] == sent[:64]
    assert "128 characters of printable ASCII" in replaced["reason"]


def test_no_correlation_id_gets_a_new_one_without_a_line_about_it(
    client: FlaskClient, tokens: Tokens, log_lines: list[str]
) -> None:
    for headers in ({}, {"x-correlation-id": ""}):
        r = client.get(f"{API}/tasks", headers=tokens.headers("writer", **headers))
        assert len(r.headers["x-correlation-id"]) == 26
    assert [json.loads(line).get("event") for line in log_lines] == [None, None]


def test_metrics_are_off_by_default(client: FlaskClient, tokens: Tokens) -> None:
    assert client.get("/metrics", headers=tokens.headers("admin")).status_code == 404


@pytest.fixture
def metrics_app(tmp_path: Path, clock: FixedClock) -> Flask:
    return create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            "METRICS": "token",
        }
    )


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith((name + "{", name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_endpoint_admin_only_and_counts(metrics_app: Flask) -> None:
    reg: TokenRegistry = metrics_app.extensions["token_registry"]
    _, admin = reg.create(role="admin", tenant="acme", project="web")
    _, writer = reg.create(role="writer", tenant="acme", project="web")
    client = metrics_app.test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {writer}"}).status_code == 403

    admin_h = {"Authorization": f"Bearer {admin}"}
    route = f"{API}/tasks/<task_id>/turns/<turn>"
    before = client.get("/metrics", headers=admin_h).get_data(as_text=True)
    for i in range(3):
        r = client.put(
            f"{API}/tasks/m{i}/turns/0",
            json={"meta": {}, "summary_md": "x" * 100},
            headers={"Authorization": f"Bearer {writer}"},
        )
        assert r.status_code in (200, 201)
    from app.ops.sweeper import run_sweep

    run_sweep(metrics_app)
    text = client.get("/metrics", headers=admin_h).get_data(as_text=True)
    puts = _value(text, "memory_http_requests_total", route=route, method="PUT")
    assert puts - _value(before, "memory_http_requests_total", route=route, method="PUT") == 3
    assert _value(text, "memory_http_request_duration_seconds_count", route=route) >= 3
    assert (
        _value(text, "memory_bytes_written_total", route=route)
        - _value(before, "memory_bytes_written_total", route=route)
        > 300
    )
    assert _value(text, "memory_lock_wait_seconds_count", outcome="acquired") >= 3
    assert "memory_sweeper_removed_total" in text
    assert _value(text, "memory_sweeper_runs_total") >= 1


def _series(text: str) -> set[str]:
    """Collect the series of a Prometheus text exposition: name and labels, not the value."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def test_made_up_methods_and_paths_add_no_series(metrics_app: Flask) -> None:
    reg: TokenRegistry = metrics_app.extensions["token_registry"]
    _, admin = reg.create(role="admin", tenant="acme", project="web")
    client = metrics_app.test_client()
    admin_h = {"Authorization": f"Bearer {admin}"}
    paths = ["/healthz", f"{API}/tasks", "/no/such/path-{}"]
    for path in paths:  # each (route, status) pair once, with the one label unknown methods get
        client.open(path.format("first"), method="XZZZ")
    client.get("/metrics", headers=admin_h)  # the scrape's own series
    before = _series(client.get("/metrics", headers=admin_h).get_data(as_text=True))
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    for i in range(300):
        method = "X" + letters[i % 26] + letters[i // 26 % 26] + "A"  # XAAA, XBAA, ...
        resp = client.open(paths[i % 3].format(i), method=method, headers=admin_h)
        assert resp.status_code in (404, 405)
    after = _series(client.get("/metrics", headers=admin_h).get_data(as_text=True))
    assert after == before
    assert 'method="other",route="unmatched",status="404"' in "".join(after)
    assert not any("XAAA" in line or "/no/such" in line for line in after)


@pytest.mark.e2e
def test_metrics_in_multiprocess_mode_under_gunicorn(tmp_path: Path) -> None:
    srv = start_server(tmp_path, workers=2, env_extra={"MEMORY_METRICS": "token"})
    try:
        admin = {"Authorization": f"Bearer {srv.token('admin')}"}
        for _ in range(20):
            assert requests.get(f"{srv.url}/healthz", timeout=5).status_code == 200
        r = requests.get(f"{srv.url}/metrics", headers=admin, timeout=5)
        assert r.status_code == 200, r.text
        # Requests land on both workers; the sum over every worker's file counts them all.
        assert _value(r.text, "memory_http_requests_total", route="/healthz") >= 20
        assert requests.get(f"{srv.url}/metrics", timeout=5).status_code == 401
    finally:
        srv.stop()
