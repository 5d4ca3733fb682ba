"""`flask --app wsgi quota set|show|clear` and `usage`, the usage gauges of /metrics, and the
MEMORY_MIN_FREE_BYTES setting."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flask import Flask

from app import create_app
from app.config import ConfigError
from app.storage.core.names import LIMITS_FILE
from app.storage.core.quota import parse_floor
from tests.conftest import FixedClock

PM = "/sandbox/memory/v1"


def make_app(tmp_path: Path, clock: FixedClock, **settings: object) -> Flask:
    return create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            "CLOCK": clock,
            **settings,
        }
    )


def run(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=list(args))
    return result.exit_code, result.output


def test_quota_set_show_clear_in_human_units(tmp_path: Path, clock: FixedClock) -> None:
    app = make_app(tmp_path, clock)
    code, out = run(app, "quota", "set", "--tenant", "acme", "--project", "web", "--bytes", "10GiB")
    assert (code, out.strip()) == (0, "project acme/web: bytes=10GiB")
    code, out = run(app, "quota", "set", "--tenant", "acme", "--project", "web", "--tasks", "500")
    assert out.strip() == "project acme/web: bytes=10GiB tasks=500"
    code, out = run(app, "quota", "set", "--tenant", "acme", "--bytes", "1.5GB")
    assert out.strip() == "tenant acme: bytes=1500000000"
    # Beside the rate limits, in the same file.
    run(app, "ratelimit", "set", "--tenant", "acme", "--project", "web", "--rps", "5")
    doc = json.loads((tmp_path / "root" / LIMITS_FILE).read_text())
    assert doc["projects"]["acme/web"] == {
        "quota": {"bytes": 10 << 30, "tasks": 500},
        "rate": {"rps": 5},
    }
    assert doc["tenants"]["acme"] == {"quota": {"bytes": 1_500_000_000}}
    code, out = run(app, "quota", "show")
    assert code == 0
    assert "tenant acme: bytes=1500000000; stores 0 byte(s)" in out
    assert "project acme/web: bytes=10GiB tasks=500; stores 0 byte(s)" in out
    code, out = run(app, "quota", "show", "--json")
    shown = json.loads(out)
    assert shown["projects"]["acme/web"]["quota"] == {"bytes": 10 << 30, "tasks": 500}
    code, out = run(app, "quota", "clear", "--tenant", "acme", "--project", "web", "--tasks")
    assert out.strip() == "project acme/web: quota cleared"
    code, out = run(app, "quota", "clear", "--tenant", "acme", "--project", "web")
    code, out = run(app, "quota", "clear", "--tenant", "acme", "--project", "web")
    assert out.strip() == "project acme/web: had no such quota"
    doc = json.loads((tmp_path / "root" / LIMITS_FILE).read_text())
    assert doc["projects"]["acme/web"] == {"rate": {"rps": 5}}  # the rate section kept


@pytest.mark.parametrize(
    "args",
    [
        ("--tenant", "acme"),  # nothing to set
        ("--tenant", "acme", "--bytes", "ten"),
        ("--tenant", "acme", "--tasks", "-1"),
        ("--tenant", "../x", "--bytes", "1"),
    ],
)
def test_bad_quota_settings_are_refused(
    tmp_path: Path, clock: FixedClock, args: tuple[str, ...]
) -> None:
    app = make_app(tmp_path, clock)
    code, _ = run(app, "quota", "set", *args)
    assert code != 0
    assert not (tmp_path / "root" / LIMITS_FILE).exists()


def test_usage_command_per_tenant_and_project(tmp_path: Path, clock: FixedClock) -> None:
    app = make_app(tmp_path, clock)
    tasks = app.extensions["storage"].tasks
    from app.storage.core.names import Scope

    tasks.put_turn(Scope("acme", "web"), "t", 0, meta={}, summary_md="x" * 98)
    tasks.put_turn(Scope("acme", "mobile"), "t", 0, meta={}, summary_md="")
    tasks.put_turn(Scope("globex", "web"), "t", 0, meta={}, summary_md="")
    run(app, "quota", "set", "--tenant", "acme", "--bytes", "1MiB")
    code, out = run(app, "usage", "--tenant", "acme")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("tenant acme: 102 byte(s): 2 task(s), 2 turn(s)")
    assert lines[1] == "  quota: bytes=1MiB"
    assert lines[2].startswith("  project acme/mobile: 2 byte(s)")
    assert lines[3].startswith("  project acme/web: 100 byte(s)")
    assert "globex" not in out
    # Sizes read as a person reads them: one unit, never "73805956KiB byte(s)".
    assert re.fullmatch(
        r"disk: \d+\.\d [KMGT]iB free; writes stop below (\d+\.\d [KMGT]iB|\d+ byte\(s\))"
        r" free \(MEMORY_MIN_FREE_BYTES\)",
        lines[-1],
    ), lines[-1]
    assert not re.search(r"iB byte\(s\)", out)
    code, out = run(app, "usage", "--json")
    body = json.loads(out)
    assert [t["tenant"] for t in body["tenants"]] == ["acme", "globex"]
    assert body["tenants"][0]["usage"]["bytes"] == 102
    assert body["disk"]["floor_bytes"] > 0


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_usage_gauges_per_project_and_kind(tmp_path: Path, clock: FixedClock) -> None:
    app = make_app(tmp_path, clock, METRICS="token")
    reg = app.extensions["token_registry"]
    _, admin = reg.create(role="admin", tenant="acme", project="web")
    _, tenant_admin = reg.create(role="tenant_admin", tenant="acme")
    client = app.test_client()
    h = {"Authorization": f"Bearer {admin}"}
    client.put(f"{PM}/tasks/t/turns/0", headers=h, json={"summary_md": "abc"})
    client.put(f"{PM}/tasks/t/turns/0/artifacts/a", headers=h, data=b"x" * 700)
    run(app, "quota", "set", "--tenant", "acme", "--project", "web", "--bytes", "1MiB")
    run(app, "quota", "set", "--tenant", "acme", "--tasks", "9")
    # Requests naming projects that hold nothing add no series: the labels come from what
    # the storage holds, never from a request.
    for i in range(20):
        th = {"Authorization": f"Bearer {tenant_admin}", "X-Sandbox-Project-Id": f"nothing{i}"}
        assert client.get(f"{PM}/tasks", headers=th).status_code == 200
    text = client.get("/metrics", headers=h).get_data(as_text=True)
    labels = {"tenant": "acme", "project": "web"}
    assert _value(text, "memory_usage_bytes", **labels, kind="artifact") == 700
    assert _value(text, "memory_usage_bytes", **labels, kind="turn") == 5
    assert _value(text, "memory_usage_items", **labels, kind="tasks") == 1
    assert _value(text, "memory_quota", **labels, kind="bytes") == 1 << 20
    assert _value(text, "memory_tenant_quota", tenant="acme", kind="tasks") == 9
    assert (_value(text, "memory_disk_free_bytes") or 0) > 0
    assert "nothing" not in text


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("2%", (0, 0.02)), ("0", (0, 0.0)), ("5GiB", (5 << 30, 0.0)), (1048576, (1 << 20, 0.0))],
)
def test_the_floor_is_bytes_or_a_share_of_the_disk(text: object, parsed: tuple[int, float]) -> None:
    assert parse_floor(text) == parsed


@pytest.mark.parametrize("bad", ["100%", "-1", "lots", "2 %%"])
def test_a_bad_floor_stops_the_start(tmp_path: Path, clock: FixedClock, bad: str) -> None:
    with pytest.raises(ConfigError, match="MEMORY_MIN_FREE_BYTES"):
        make_app(tmp_path, clock, MIN_FREE_BYTES=bad)
