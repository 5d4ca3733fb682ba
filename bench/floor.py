"""The floor of this design: the fewest moves that record a turn the way the service does.

A minimal Flask app, served by the service's own gunicorn.conf.py (the same worker class,
workers and threads), that answers the two requests of a record, ``PUT .../turns/<n>`` and
``PUT .../turns/<n>/artifacts/<name>``, and the one-request record (the turn and its
artifacts as one multipart ``PUT .../turns/<n>``, parsed by werkzeug as Flask does), and
writes the files the service writes for them:
``task.json`` on a task's first turn, the turn's ``meta.json`` (the record, durable),
``summary.md`` and ``index.json`` (derived, rewritten from the previous index, not fsynced),
all under one ``filelock.FileLock`` per task; the artifact streamed to a temp file in its
directory, renamed into place under the lock, made durable before the ``meta.json`` that
names it, with its size and SHA-256 in the record. Durability is the service's group commit
on ext4 (one ``syncfs`` shared by every thread waiting, started after the waiter's writes)
and an fsync of each file and directory elsewhere.

What it leaves out is everything the service adds on top of storing the bytes: tokens and
scopes, quotas, rate limits, the request log and traffic counts, the listing and search
database, the project digest, precondition headers, containment and link checks, the
in-flight journal, validation beyond the ids. So ours / floor is what those cost.

    gunicorn -c gunicorn.conf.py bench.floor:app      (files under $MEMORY_STORAGE_ROOT/floor)
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import filelock
import orjson
from flask import Flask, Response, abort, request

app = Flask(__name__)

ROOT = Path(os.environ.get("MEMORY_STORAGE_ROOT", "/tmp/pm-floor")) / "floor"  # noqa: S108
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RETENTION_US = 30 * 86_400 * 1_000_000
CHUNK = 1 << 20

_libc = ctypes.CDLL(None, use_errno=True)


def _group_commit_applies(root: Path) -> bool:
    """syncfs is a barrier on ext4 (data=ordered) and tmpfs, as the service decides."""
    dev = os.stat(root).st_dev
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] == wanted:
                fstype = fields[fields.index("-", 6) + 1]
                return fstype in ("ext4", "ext3", "tmpfs") and "data=writeback" not in line
    return False


class Flusher:
    """One syncfs for every thread of the process waiting: each waiter needs a flush that
    started after its writes, so it waits for the next round; the first to find none running
    runs it for all."""

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.cond = threading.Condition()
        self.started = self.finished = 0
        self.running = False

    def wait(self) -> None:
        with self.cond:
            target = self.started + 1
            while self.finished < target:
                if self.running:
                    self.cond.wait()
                    continue
                self.running = True
                self.started += 1
                number = self.started
                self.cond.release()
                try:
                    failed = _libc.syncfs(self.fd) != 0
                finally:
                    self.cond.acquire()
                    self.running = False
                    self.finished = number
                    self.cond.notify_all()
                if failed:
                    raise OSError(ctypes.get_errno(), "syncfs failed")


_flusher: Flusher | None = None
_flusher_pid = -1
_flusher_mutex = threading.Lock()


def flusher() -> Flusher | None:
    """This process's flusher (made after the fork), None where each write fsyncs itself."""
    global _flusher, _flusher_pid
    if _flusher_pid != os.getpid():
        with _flusher_mutex:
            if _flusher_pid != os.getpid():
                ROOT.mkdir(parents=True, exist_ok=True)
                grouped = os.environ.get("MEMORY_GROUP_COMMIT", "true").lower() != "false"
                _flusher = Flusher(ROOT) if grouped and _group_commit_applies(ROOT) else None
                _flusher_pid = os.getpid()
    return _flusher


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Temp file in the same directory, write, (fsync), rename, (fsync the directory)."""
    tmp = path.parent / f".tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        os.write(fd, data)
        if durable and flusher() is None:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable and flusher() is None:
        fsync_dir(path.parent)


def make_dir(path: Path) -> None:
    try:
        os.mkdir(path, 0o750)
    except FileExistsError:
        return
    if flusher() is None:
        fsync_dir(path.parent)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def read(path: Path) -> Any | None:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def iso(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + (
        f".{us % 1_000_000:06d}Z"
    )


@functools.lru_cache(maxsize=1024)
def task_lock(task_id: str) -> filelock.BaseFileLock:
    """The task's lock, one object per task and process (thread-local by default: each
    thread holds it through its own descriptor, so threads exclude each other too)."""
    locks = ROOT / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(locks / f"{task_id}.lock"), timeout=10)


def checked(value: str) -> str:
    if not ID.fullmatch(value):
        abort(422)
    return value


def write_index(task_dir: Path, task_id: str, record: dict[str, Any]) -> None:
    """index.json from the previous one and this turn (derived: not fsynced)."""
    index = read(task_dir / "index.json") or {"task_id": task_id, "turns": []}
    entry = {k: v for k, v in record.items() if k not in ("summary_md", "task_id", "version")}
    entry["artifacts"] = [a["name"] for a in record["artifacts"]]
    index["turns"] = [t for t in index["turns"] if t["turn"] != record["turn"]] + [entry]
    index["turns"].sort(key=lambda t: t["turn"])
    index["updated_us"] = record["updated_us"]
    write_file(task_dir / "index.json", dumps(index), durable=False)


def answer(body: dict[str, Any]) -> Response:
    """Wait for a flush that covers this request's writes, then answer."""
    found = flusher()
    if found is not None:
        found.wait()
    return app.response_class(orjson.dumps(body), mimetype="application/json")


def _stage(directory: Path, stream: Any) -> tuple[Path, str, int]:
    """Stream an artifact to a temp file in ``directory``: (path, sha256, size)."""
    make_dir(directory)
    tmp = directory / f".tmp-{secrets.token_hex(8)}"
    digest, size = hashlib.sha256(), 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            os.write(fd, chunk)
        if flusher() is None:
            os.fsync(fd)
    finally:
        os.close(fd)
    return tmp, digest.hexdigest(), size


Staged = tuple[str, Path, str, int, str]  # name, temp file, sha256, size, content type


def turn_of(data: Any) -> dict[str, Any]:
    """A turn's JSON as the floor takes it (422 otherwise)."""
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        abort(422)
    return data


def record_turn(task_id: str, turn: int, data: dict[str, Any], staged: list[Staged]) -> Response:
    """Under the task lock: task.json on a first turn, the staged artifacts published and made
    durable, then the turn's meta.json naming them (the record), summary.md and index.json."""
    summary = str(data.get("summary_md", ""))
    task_dir = ROOT / task_id
    turn_dir = task_dir / f"{turn:04d}-turn"
    directory = turn_dir / "artifacts"
    with task_lock(task_id):
        now_us = time.time_ns() // 1000
        if not (task_dir / "task.json").exists():
            make_dir(task_dir)
            task = {"version": 1, "task_id": task_id, "created_at": iso(now_us)}
            write_file(task_dir / "task.json", dumps(task), durable=True)
        make_dir(turn_dir)
        previous = read(turn_dir / "meta.json")
        artifacts = {a["name"]: a for a in (previous["artifacts"] if previous else [])}
        for name, tmp, sha, size, content_type in staged:
            os.replace(tmp, directory / name)
            artifacts[name] = {
                "name": name,
                "content_type": content_type,
                "size": size,
                "sha256": sha,
                "updated_at": iso(now_us),
            }
        found = flusher()
        if staged and found is not None:
            found.wait()  # the bytes are durable before a record names them
        elif staged:
            fsync_dir(directory)
        record = {
            "version": 1,
            "task_id": task_id,
            "turn": turn,
            "meta": data["meta"],
            "summary_md": summary,
            "artifacts": list(artifacts.values()),
            "created_at": previous["created_at"] if previous else iso(now_us),
            "updated_at": iso(now_us),
            "retain_until": iso(now_us + RETENTION_US),
            "updated_us": now_us,
        }
        write_file(turn_dir / "meta.json", dumps(record), durable=True)
        write_file(turn_dir / "summary.md", summary.encode(), durable=False)
        write_index(task_dir, task_id, record)
    return answer(record)


def put_turn_form(task_id: str, turn: int) -> Response:
    """A turn and its artifacts in one multipart request (the service's one-request record):
    the artifacts staged, then recorded with the turn."""
    try:
        data = turn_of(orjson.loads(request.form["turn"]))
    except (KeyError, orjson.JSONDecodeError):
        abort(422)
    turn_dir = ROOT / task_id / f"{turn:04d}-turn"
    staged: list[Staged] = []
    parts = request.files.getlist("artifact")
    if parts:
        for path in (turn_dir.parent, turn_dir):
            make_dir(path)
    for part in parts:
        name = checked(part.filename or "")
        tmp, sha, size = _stage(turn_dir / "artifacts", part.stream)
        staged.append((name, tmp, sha, size, part.mimetype or "application/octet-stream"))
    return record_turn(task_id, turn, data, staged)


@app.put("/sandbox/memory/v1/tasks/<task_id>/turns/<int:turn>")
def put_turn(task_id: str, turn: int) -> Response:
    """Store a turn's meta and summary (JSON), or a turn with its artifacts (multipart)."""
    task_id = checked(task_id)
    if request.mimetype == "multipart/form-data":
        return put_turn_form(task_id, turn)
    return record_turn(task_id, turn, turn_of(request.get_json()), [])


@app.put("/sandbox/memory/v1/tasks/<task_id>/turns/<int:turn>/artifacts/<name>")
def put_artifact(task_id: str, turn: int, name: str) -> Response:
    """Store a turn artifact: streamed to a temp file, published under the task lock."""
    task_id, name = checked(task_id), checked(name)
    task_dir = ROOT / task_id
    turn_dir = task_dir / f"{turn:04d}-turn"
    if not (turn_dir / "meta.json").exists():
        abort(404)
    directory = turn_dir / "artifacts"
    tmp, sha, size = _stage(directory, request.stream)
    with task_lock(task_id):
        record = read(turn_dir / "meta.json")
        if record is None:
            os.unlink(tmp)
            abort(404)
        os.replace(tmp, directory / name)
        found = flusher()
        if found is not None:
            found.wait()  # the bytes are durable before a record names them
        else:
            fsync_dir(directory)
        now_us = time.time_ns() // 1000
        info = {
            "name": name,
            "content_type": request.content_type or "application/octet-stream",
            "size": size,
            "sha256": sha,
            "updated_at": iso(now_us),
        }
        record["artifacts"] = [a for a in record["artifacts"] if a["name"] != name] + [info]
        record.update(
            updated_at=iso(now_us), retain_until=iso(now_us + RETENTION_US), updated_us=now_us
        )
        write_file(turn_dir / "meta.json", dumps(record), durable=True)
        write_index(task_dir, task_id, record)
    return answer({**info, "task_id": task_id, "turn": turn})


@app.get("/healthz")
def healthz() -> dict[str, str]:
    """Answer that the process is up."""
    return {"status": "ok"}


@app.errorhandler(OSError)
def os_error(exc: OSError) -> tuple[dict[str, str], int]:
    status = 507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 500
    return {"detail": str(exc)}, status
