"""`flask --app wsgi ratelimit set|show|clear`: overrides in <root>/.limits.json."""

from __future__ import annotations

import json
from pathlib import Path

from flask import Flask

from app import create_app
from app.storage.core.limits import RateOverride
from app.storage.core.names import LIMITS_FILE


def make_app(tmp_path: Path, **settings: object) -> Flask:
    return create_app(
        {
            "STORAGE_ROOT": str(tmp_path / "root"),
            "TOKENS_FILE": str(tmp_path / "tokens.json"),
            **settings,
        }
    )


def run(app: Flask, *args: str) -> tuple[int, str]:
    result = app.test_cli_runner().invoke(args=["ratelimit", *args])
    return result.exit_code, result.output


def test_set_show_clear_round_trip(tmp_path: Path) -> None:
    app = make_app(tmp_path, RATE_LIMIT_RPS=10)
    code, out = run(
        app,
        *("set", "--tenant", "acme", "--project", "web", "--rps", "100", "--burst", "200"),
        *("--upload-bps", "10MiB", "--upload-burst", "50MiB"),
    )
    assert code == 0, out
    assert out.strip() == (
        "project acme/web: rps=100 burst=200 upload_bps=10MiB upload_burst=50MiB -> "
        "100 requests/s, burst 200; 10 MiB/s of request bodies, burst 50 MiB"
    )
    code, out = run(app, "set", "--tenant", "acme", "--rps", "5")
    assert code == 0 and out.strip() == "tenant acme: rps=5 -> 5 requests/s, burst 5"
    assert app.extensions["rate_limiter"].file.rates().projects[("acme", "web")] == RateOverride(
        rps=100, burst=200, upload_bps=10 << 20, upload_burst=50 << 20
    )

    code, out = run(app, "show")
    assert code == 0
    assert out.splitlines() == [
        "settings (MEMORY_RATE_LIMIT_*): 10 requests/s, burst 10; admin tokens exempt",
        "tenant acme: rps=5 -> 5 requests/s, burst 5",
        "project acme/web: rps=100 burst=200 upload_bps=10MiB upload_burst=50MiB -> "
        "100 requests/s, burst 200; 10 MiB/s of request bodies, burst 50 MiB",
    ]
    code, out = run(app, "show", "--tenant", "acme", "--project", "mobile")
    assert out.splitlines()[-1] == "project acme/mobile: 5 requests/s, burst 5"
    code, out = run(app, "show", "--tenant", "globex", "--project", "web", "--json")
    shown = json.loads(out)
    assert shown["applies"]["text"] == "10 requests/s, burst 10"
    assert shown["file"] == str(tmp_path / "root" / LIMITS_FILE)

    code, out = run(app, "clear", "--tenant", "acme", "--project", "web")
    assert code == 0 and out.strip() == "project acme/web: rate limits cleared"
    code, out = run(app, "clear", "--tenant", "acme", "--project", "web")
    assert code == 0 and out.strip() == "project acme/web: had no rate limits set"
    code, out = run(app, "show", "--json")
    shown = json.loads(out)
    assert shown["projects"] == {}
    assert shown["tenants"]["acme"]["rate"] == {"rps": 5}


def test_set_changes_only_the_fields_given(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    assert run(app, "set", "--tenant", "acme", "--project", "web", "--rps", "3")[0] == 0
    assert run(app, "set", "--tenant", "acme", "--project", "web", "--burst", "9")[0] == 0
    doc = json.loads((tmp_path / "root" / LIMITS_FILE).read_text())
    assert doc["projects"]["acme/web"]["rate"] == {"rps": 3, "burst": 9}


def test_refusals_name_the_problem_and_write_nothing(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    code, out = run(app, "set", "--tenant", "acme", "--project", "web")
    assert code == 2 and "give at least one of" in out
    code, out = run(app, "set", "--tenant", "acme", "--upload-bps", "10 parsecs")
    assert code == 2 and "not a byte count" in out
    code, out = run(app, "set", "--tenant", "acme", "--rps", "-1")
    assert code == 2
    code, out = run(app, "set", "--tenant", "acme", "--project", "web", "--burst", "5")
    assert code == 1 and "burst needs rps" in out
    code, out = run(app, "set", "--tenant", "../x", "--rps", "1")
    assert code == 1 and "tenant" in out
    code, out = run(app, "set", "--tenant", "acme", "--project", "web", "--rps", "1e-320")
    assert code == 1 and "refill within 86,400 s" in out
    code, out = run(app, "show", "--project", "web")
    assert code == 2 and "--project needs --tenant" in out
    assert not (tmp_path / "root" / LIMITS_FILE).exists()


def test_a_broken_file_is_reported_not_overwritten(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "root" / LIMITS_FILE).write_text("{oops")
    code, out = run(app, "show")
    assert code == 1 and "not valid JSON" in out
    code, out = run(app, "set", "--tenant", "acme", "--rps", "1")
    assert code == 1 and (tmp_path / "root" / LIMITS_FILE).read_text() == "{oops"


def test_show_names_an_entry_that_limits_nothing(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "root" / LIMITS_FILE).write_text(
        '{"version": 1, "projects": {"acme/web": {"rate": {"rps": 1e-320}},'
        ' "acme/ok": {"rate": {"rps": 2}}}}'
    )
    code, out = run(app, "show")
    assert code == 0 and "project acme/ok: rps=2" in out, out
    assert "skipped, limits nothing" in out and "projects.acme/web" in out, out
    code, out = run(app, "set", "--tenant", "acme", "--project", "web", "--rps", "1")
    assert code == 0, out  # a change replaces the bad section
    assert "skipped" not in run(app, "show")[1]
