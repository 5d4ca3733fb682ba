"""gunicorn settings used by `make run` (and by any `gunicorn -c gunicorn.conf.py wsgi:app`).

gthread workers: a sync worker is killed mid-upload by its timeout when a client is slow.
app.ops.serving.EdgeWorker is gthread that reads request heads without holding a thread, bounds body
reads and answers its own errors in JSON.
"""

from __future__ import annotations

import os

from app.ops.startup import gunicorn_settings

# Every MEMORY_* setting is checked here, before gunicorn starts: a bad one is one line on
# stderr and exit status 2.
_settings = gunicorn_settings()
bind = _settings.bind
workers = _settings.workers
threads = _settings.threads
worker_class = "app.ops.serving.EdgeWorker"
timeout = _settings.timeout
# Per storage root (<root>/.gunicorn.ctl), not one per user shared by every instance.
control_socket = _settings.control_socket
control_socket_disable = _settings.control_socket_disable
graceful_timeout = 30
# Proxy headers are the app's to believe, from the MEMORY_TRUSTED_PROXIES proxies in front
# (app/web/origins.py): gunicorn's default would take X-Forwarded-Proto (and -Ssl, -Protocol)
# from any client of 127.0.0.1, whatever that setting says.
forwarded_allow_ips = ""
accesslog = None  # the app writes one structured JSON line per request
errorlog = "-"
# Files SQLite and gunicorn create get the modes the engine gives its own (owner rw, group r).
umask = 0o027


_created_metrics_dirs: list[str] = []
_held: list[object] = []
_app: list[object] = []  # the master's app (on_starting): child_exit repairs with its storage


def _metrics_dir() -> None:
    """Give prometheus-client's multiprocess mode an empty directory shared by every worker.

    Must run before anything imports prometheus_client, hence first thing in on_starting.
    """
    if os.environ.get("MEMORY_METRICS", "off") != "token":
        return
    import shutil
    import tempfile

    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        shutil.rmtree(path, ignore_errors=True)  # stale files from a previous run
        os.makedirs(path, exist_ok=True)
    else:
        path = tempfile.mkdtemp(prefix="memory-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        _created_metrics_dirs.append(path)


def on_starting(server):  # noqa: ANN001, ANN201 - gunicorn hook signature
    """Take the storage root, repair what an unclean stop left, create the rate limit table
    the workers share and, on first start, a first token printed once.

    A second server on the same root stops here with one line naming the holder's PID,
    before it touches anything (app/storage/tree/recovery.py).
    """
    _metrics_dir()
    from app.ops.bootstrap import first_start
    from app.ops.startup import checked_app, fail
    from app.ops.sweeper import startup_recovery, storage_of
    from app.storage.core.recovery import RootBusy
    from app.web.ratelimit import share_across_workers

    share_across_workers()  # before the fork: one rate limit table for every worker
    app = checked_app()  # a backend that refuses to start: one line, exit status 2
    if app.config.get("EMBEDDER") == "bundled":
        from app.embeddings.bundled import preload

        preload()  # before the fork: the workers share the model's weights
    try:
        lines = startup_recovery(app)
    except RootBusy as exc:
        fail(str(exc))
    # The root lock lives as long as its descriptor: keep it for the master's lifetime.
    storage = storage_of(app)  # the StorageBackend (app/storage/interface.py)
    _held.append(storage.recovery)
    _app.append(app)
    first_start(bind, app)
    for line in lines:
        server.log.warning(line)
    # The workers make their own connections after the fork; the master keeps none.
    storage.close()


def post_fork(server, worker):  # noqa: ANN001, ANN201
    """Cap the new worker's malloc arenas before it loads the app or starts a thread
    (app/ops/heap.py)."""
    from app.ops.heap import limit_arenas

    limit_arenas()


def post_worker_init(worker):  # noqa: ANN001, ANN201
    """Start this worker's sweeper thread (only the holder of the leader lock sweeps) and its
    heap trimmer (app/ops/heap.py)."""
    from app.ops.heap import start_trimmer
    from app.ops.sweeper import start_for_worker

    start_for_worker(worker.wsgi)
    start_trimmer()


def worker_exit(server, worker):  # noqa: ANN001, ANN201
    """Write this worker's last request counts (app/web/traffic.py) before it goes."""
    app = getattr(worker, "wsgi", None)
    recorder = getattr(app, "extensions", {}).get("traffic")
    if recorder is not None:
        recorder.close()


def child_exit(server, worker):  # noqa: ANN001, ANN201
    """Repair the writes a dead worker left in flight (a worker killed mid-write leaves its
    journal slots set, and derived files stale until the next write on the same lock stripe),
    and drop its live-gauge files (prometheus multiprocess mode)."""
    if _app:
        from app.ops.sweeper import worker_died

        for line in worker_died(_app[0]):
            server.log.warning(line)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def on_exit(server):  # noqa: ANN001, ANN201
    """A clean shutdown: remove the running sentinel (see on_starting)."""
    from app import create_app
    from app.ops.sweeper import clean_shutdown

    clean_shutdown(create_app())
    import shutil

    for path in _created_metrics_dirs:
        shutil.rmtree(path, ignore_errors=True)
