"""schemathesis against a real gunicorn, on every backend: every check (``--checks all``), the
stateless (fuzzing) and stateful phases, a fixed seed and example count.

The served OpenAPI document states the rules the server enforces (app/schemas/rules.py), so
a request the document calls valid is taken and one it calls invalid is refused, and nothing
answers 5xx; schemathesis.toml says what a document cannot (page cursors, preconditions, the
form's part order). Any failure fails the test, with schemathesis's own report of it.

The bounded run takes well under a minute per backend. ``make conformance``
(``MEMORY_SCHEMATHESIS_FULL=1``) runs
every phase (the coverage phase too) with 30 examples per operation: several thousand cases,
some minutes per backend.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import backends_first_then_slow
from tests.e2e.conftest import REPO, VENV_BIN, Server, start_server

pytestmark = pytest.mark.e2e

SEED = 20261203
FULL = os.environ.get("MEMORY_SCHEMATHESIS_FULL") == "1"
EXAMPLES = 30 if FULL else 6
PHASES = "examples,coverage,fuzzing,stateful" if FULL else "fuzzing,stateful"
# Every operation of both APIs is in the document (tests/api/test_openapi.py keeps it so).
MIN_OPERATIONS = 29


@pytest.fixture(params=backends_first_then_slow())
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    env: dict[str, str] = {}
    if request.param == "pg":
        services: Any = request.getfixturevalue("services")
        env = {f"MEMORY_{k}": v for k, v in services.settings().items()}
    srv = start_server(tmp_path_factory.mktemp(f"st-{request.param}"), env_extra=env)
    try:
        yield srv
    finally:
        srv.stop()


def run_schemathesis(server: Server, report: Path) -> subprocess.CompletedProcess[str]:
    """``st run`` against ``server``'s document with a project_admin token (from the
    repository's root, whose schemathesis.toml it reads)."""
    token = server.token("project_admin")
    args = [
        str(VENV_BIN / "st"),
        "--config-file",
        str(REPO / "schemathesis.toml"),
        "run",
        f"{server.url}/sandbox/memory/v1/openapi.yaml",
        "-H",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--phases",
        PHASES,
        "--seed",
        str(SEED),
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "2",
        "--no-color",
        "--output-truncate",
        "false",
        "--report",
        "junit",
        "--report-dir",
        str(report),
    ]
    return subprocess.run(
        args,
        cwd=REPO,
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=1800 if FULL else 300,
        check=False,
    )


def test_the_server_keeps_its_openapi_document(server: Server, tmp_path: Path) -> None:
    done = run_schemathesis(server, tmp_path / "report")
    out = done.stdout + done.stderr
    print(out)
    tested = re.search(r"Tested:\s+(\d+)", out)
    counts = re.search(r"(\d+) generated, (\d+) (?:passed|found)", out)
    assert tested and counts, out[-4000:]
    # It ran: every operation, and cases of each; a run that tests nothing proves nothing.
    assert int(tested.group(1)) >= MIN_OPERATIONS, out[-4000:]
    assert int(counts.group(1)) >= 5 * MIN_OPERATIONS, out[-4000:]
    # Exit 0: no failure of any check (a 5xx, a valid request refused, an invalid one taken,
    # an answer the document does not describe).
    assert done.returncode == 0, out[-12000:]
    assert "Internal Server Error" not in server.log()
