"""gunicorn settings used by `make run` (and by any `gunicorn -c gunicorn.conf.py wsgi:app`).

gthread workers: a sync worker is killed mid-upload by its timeout when a client is slow.
"""

from __future__ import annotations

import os

bind = os.environ.get("MEMORY_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("MEMORY_WORKERS", "2"))
threads = int(os.environ.get("MEMORY_THREADS", "4"))
worker_class = "gthread"
timeout = int(os.environ.get("MEMORY_WORKER_TIMEOUT", "60"))
graceful_timeout = 30
accesslog = None  # the app writes one structured JSON line per request
errorlog = "-"
umask = 0o022


def on_starting(server):  # noqa: ANN001, ANN201 - gunicorn hook signature
    """Create the storage root and, on first start, a first token printed once."""
    from app.bootstrap import first_start

    first_start(bind)
