"""The gunicorn the edge worker is written against: the requirement names the releases that
have every internal it imports, and the installed gunicorn is one of them."""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def gunicorn_requirement() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = [
        *project.get("dependencies", []),
        *(r for extra in project.get("optional-dependencies", {}).values() for r in extra),
    ]
    found = [Requirement(r) for r in requirements if Requirement(r).name == "gunicorn"]
    assert len(found) == 1, found
    return found[0]


def test_the_requirement_excludes_the_releases_without_the_workers_internals() -> None:
    spec = gunicorn_requirement().specifier
    # 27.0.0 has no STOP_KEEPALIVE_LINGER; 26.2 neither; 23.0 has no gunicorn.http2. A new
    # major release may move any of them: it is let in only once the worker is checked on it.
    for refused in ("23.0.0", "26.2.0", "27.0.0", "28.0.0"):
        assert Version(refused) not in spec, refused
    assert Version("27.0.1") in spec


def test_the_installed_gunicorn_is_in_range_and_the_worker_imports() -> None:
    installed = importlib.metadata.version("gunicorn")
    assert Version(installed) in gunicorn_requirement().specifier, installed
    serving = importlib.import_module("app.ops.serving")
    worker = serving.EdgeWorker
    gthread = importlib.import_module("gunicorn.workers.gthread")
    assert issubclass(worker, gthread.ThreadWorker)
    # The internals it leans on at run time, not only at import.
    for name in ("enqueue_req", "murder_pending", "handle", "handle_request", "handle_error"):
        assert callable(getattr(gthread.ThreadWorker, name)), name
