"""A misconfigured object store stops the start with one line and exit status 2 (gunicorn and
`flask --app wsgi` alike), instead of a 500 on every artifact write."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Services, selected_backends
from tests.e2e.conftest import REPO, VENV_BIN, free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        "pg" not in selected_backends(), reason="MEMORY_TEST_BACKENDS does not name pg"
    ),
]


@pytest.mark.parametrize(
    ("bucket", "said"),
    [("ab", "not a valid bucket name"), ("no-such-bucket-here", "does not exist")],
)
@pytest.mark.parametrize("command", ["gunicorn", "flask"])
def test_a_bad_bucket_is_one_line_and_exit_2(
    services: Services, tmp_path: Path, bucket: str, said: str, command: str
) -> None:
    settings = services.settings()
    env = {
        **os.environ,
        **{f"MEMORY_{k}": v for k, v in settings.items()},
        "MEMORY_BLOB_URL": f"s3://{bucket}/prefix",
        "MEMORY_STORAGE_ROOT": str(tmp_path / "root"),
        "MEMORY_TOKENS_FILE": str(tmp_path / "tokens.json"),
        "MEMORY_BIND": f"127.0.0.1:{free_port()}",
    }
    if command == "gunicorn":
        args = [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"]
    else:
        args = [str(VENV_BIN / "flask"), "--app", "wsgi", "fsck"]
    result = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    last = lines[-1]
    assert last.startswith("project-memory: "), result.stderr
    assert f"MEMORY_BLOB_URL bucket {bucket!r}" in last and said in last, last
