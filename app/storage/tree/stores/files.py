"""A memory store's files: its records, read and written, and the files derived from them, its
index and its live tree (tree/fs/layout.py names every path).

Every path comes from a validated id and is checked to stay under the root with no link on
the way (``Layout.check_inside``) before it is written; records are read through
``Layout.read_bytes``, which refuses a link anywhere on the way. A link found among a store's
files is reported, never entered, read, written through or removed.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

from app.storage.core.encoding import dumps
from app.storage.core.errors import Corrupt, InvalidName, NotFound, StorageError, UnsafePath
from app.storage.core.names import STORE_ID_RE, TMP_PREFIX, VERSION_ID_RE, Scope
from app.storage.core.record_rules import check_version_record
from app.storage.core.store_records import MemoryRow, StoreRecord, VersionRecord
from app.storage.core.usage import StoreUsage
from app.storage.tree.fs.atomic import make_dirs, write_atomic
from app.storage.tree.fs.layout import Layout
from app.storage.tree.records import read_json_bytes
from app.storage.tree.sqlite.store_index import IndexContent, StoreIndex, rows_from_records


class Retry(Exception):
    """A lock-free read raced a writer (a redaction or a sweep moved a head); read again."""


class StoreFiles:
    """The records, index and live files of every memory store under one root."""

    def __init__(self, layout: Layout, *, lock_timeout: float) -> None:
        self.layout = layout
        self.tree = layout.tree
        self.root = layout.root
        self.lock_timeout = lock_timeout

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def store_dir(self, scope: Scope, store_id: str) -> Path:
        """The directory of ``store_id`` (NotFound for an id no store can have)."""
        try:
            return self.layout.store_dir(scope, store_id)
        except StorageError:
            raise NotFound(f"memory store {store_id} not found") from None

    def index(self, store_dir: Path) -> StoreIndex:
        # SQLite follows links: refuse a linked store directory or index file first.
        path = self.layout.check_inside(self.layout.store_index(store_dir))
        return StoreIndex(path, timeout=self.lock_timeout)

    # -- records -----------------------------------------------------------------------
    def store_record(self, store_dir: Path) -> StoreRecord:
        path = self.layout.store_record(store_dir)
        obj = read_json_bytes(self.layout.read_bytes(path), path)
        if obj is None:
            raise NotFound(f"memory store {store_dir.name} not found")
        return StoreRecord.from_json(obj, path)

    def version_record(self, store_dir: Path, version_id: str) -> VersionRecord | None:
        if not isinstance(version_id, str) or not VERSION_ID_RE.fullmatch(version_id):
            return None
        path = self.layout.version_file(store_dir, version_id)
        obj = read_json_bytes(self.layout.read_bytes(path), path)
        return None if obj is None else VersionRecord.from_json(obj, path)

    def head_content(self, store_dir: Path, row: MemoryRow) -> str:
        """The content of a live memory's head version (Retry when the head moved)."""
        record = self.version_record(store_dir, row.head)
        if record is None or record.content_sha256 != row.sha or record.content is None:
            raise Retry
        return record.content

    def write_store_record(self, store_dir: Path, record: StoreRecord) -> None:
        path = self.layout.check_inside(self.layout.store_record(store_dir))
        write_atomic(path, dumps(record.to_json()))

    def version_path(self, store_dir: Path, version_id: str) -> Path:
        """The file of a version to write, refused (UnsafePath) if a link is on the way."""
        return self.layout.check_inside(self.layout.version_file(store_dir, version_id))

    def rewrite_version(self, store_dir: Path, version_id: str, record: VersionRecord) -> None:
        """Rewrite a version record (redaction, the one change a version ever sees)."""
        write_atomic(self.version_path(store_dir, version_id), dumps(record.to_json()))

    def remove_temp_versions(self, store_dir: Path) -> None:
        """Remove the temp files among the versions (the caller holds the store lock)."""
        for entry in self.tree.entries(self.layout.versions_dir(store_dir)):
            if entry.name.startswith(TMP_PREFIX) and not entry.is_link:
                self.tree.unlink(entry.path)

    def load_records(
        self,
        store_dir: Path,
        problems: list[str] | None = None,
        torn: list[Path] | None = None,
        rules: list[str] | None = None,
    ) -> list[VersionRecord]:
        """Every version record of a store, without its content (read on demand); the
        unreadable ones are described in ``problems`` and, unless they are links, their
        paths listed in ``torn``; ``rules``: where the records the API would not have
        written are described (core/record_rules.py)."""
        records = []
        for entry in self.tree.entries(self.layout.versions_dir(store_dir)):
            stem = entry.name.removesuffix(".json")
            if entry.name.startswith(".") or not VERSION_ID_RE.fullmatch(stem):
                continue
            try:
                if entry.is_link:
                    raise UnsafePath("a symlink (never followed; remove it by hand)")
                record = self.version_record(store_dir, stem)
                if record is None or record.id != stem:
                    raise Corrupt("not a version record of this name")
            except (Corrupt, UnsafePath) as exc:
                if problems is not None:
                    problems.append(f"{self.rel(entry.path)}: unreadable version ({exc})")
                if torn is not None and not entry.is_link:
                    torn.append(entry.path)
                continue
            if rules is not None:
                try:
                    check_version_record(record)
                except InvalidName as exc:
                    rules.append(
                        f"{self.rel(entry.path)}: {exc} (not a record the API would write)"
                    )
            records.append(record.without_content())
        return records

    # -- stores ------------------------------------------------------------------------
    def scan_stores(self, scope: Scope) -> Iterator[StoreRecord]:
        """The record of every store of ``scope`` that can be read, in no order."""
        for entry in self.tree.entries(self.layout.stores_dir(scope)):
            if not entry.is_dir or not STORE_ID_RE.fullmatch(entry.name):
                continue
            try:
                record = self.store_record(entry.path)
            except (Corrupt, UnsafePath, NotFound):
                # Damaged, linked (fsck reports both) or deleted while we looked: the list
                # stays usable.
                continue
            yield record

    # -- the live tree -----------------------------------------------------------------
    def live_path(self, store_dir: Path, path: str) -> Path:
        """The live file of ``path``, refused (UnsafePath) if a link is on the way."""
        return self.layout.check_inside(self.layout.memory_file(store_dir, path))

    def write_live(self, store_dir: Path, record: VersionRecord) -> None:
        """Write the live file of a version that leaves its memory live."""
        target = self.live_path(store_dir, str(record.path))
        make_dirs(target.parent, self.layout.memories_dir(store_dir))
        # Derived from the version record just written: not fsynced (atomic_file).
        write_atomic(target, str(record.content).encode("utf-8"), durable=False)

    def remove_live(self, store_dir: Path, path: str) -> None:
        """Remove a live file and the parent directories it leaves empty."""
        memories = self.layout.memories_dir(store_dir)
        target = self.live_path(store_dir, path)
        self.tree.unlink(target)
        parent = target.parent
        while parent != memories and memories in parent.parents and self.tree.rmdir(parent):
            parent = parent.parent

    def expected_tree(self, store_dir: Path, content: IndexContent) -> dict[str, bytes]:
        tree = {}
        for row in content.memories:
            record = self.version_record(store_dir, row.head)
            tree[row.path] = str(record.content if record else "").encode("utf-8")
        return tree

    def sync_tree(self, store_dir: Path, expected: dict[str, bytes], apply: bool) -> list[str]:
        """Compare (and with ``apply`` fix) the live files against ``expected``.

        Links are reported and left alone: never entered, read, written through or removed.
        """
        memories = self.layout.memories_dir(store_dir)
        st = self.tree.lstat(memories)
        if st is not None and stat.S_ISLNK(st.st_mode):
            return [f"{self.rel(memories)}: symlink (never followed; remove it by hand)"]
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return [f"{self.rel(memories)}: not a directory"]
        diffs: list[str] = []
        if st is None:
            diffs.append(f"{self.rel(memories)}: missing")
            if apply:
                make_dirs(memories, store_dir)
        steps = list(self.tree.walk(memories))
        seen = set()
        for step in steps:
            for entry in step.entries:
                rel = "/" + entry.path.relative_to(memories).as_posix()
                where = self.rel(entry.path)
                if entry.is_link:
                    diffs.append(f"{where}: symlink (never followed; remove it by hand)")
                elif entry.is_file and rel in expected:
                    seen.add(rel)
                    if self.layout.read_bytes(entry.path) != expected[rel]:
                        diffs.append(f"{where}: content differs from its head version")
                        if apply:
                            write_atomic(entry.path, expected[rel])
                elif not entry.is_dir:
                    # Live files are written under the store lock, which the caller holds: a
                    # temp file here is a dead writer's, never one in flight.
                    kind = "leftover temp file" if entry.name.startswith(TMP_PREFIX) else None
                    diffs.append(f"{where}: {kind or 'not a live memory'}")
                    if apply:
                        self.tree.unlink(entry.path)
        if apply:
            for step in reversed(steps[1:]):
                self.tree.rmdir(step.path)  # only succeeds when it is (now) empty
        for rel, data in expected.items():
            if rel not in seen:
                diffs.append(
                    f"{self.rel(self.layout.memory_file(store_dir, rel))}: live file missing"
                )
                if apply:
                    self._restore_live(store_dir, rel, data)
        return diffs

    def _restore_live(self, store_dir: Path, rel: str, data: bytes) -> None:
        target = self.live_path(store_dir, rel)
        memories = self.layout.memories_dir(store_dir)
        for parent in reversed(target.relative_to(memories).parents[:-1]):
            here = memories / parent
            st = self.tree.lstat(here)
            if st is not None and not self.tree.is_dir(here):
                self.tree.unlink(here)  # a file where the memory needs a directory
        make_dirs(target.parent, memories)
        write_atomic(target, data)

    # -- the rebuild -------------------------------------------------------------------
    def rebuild(self, store_dir: Path) -> tuple[IndexContent, StoreUsage]:
        """Make the index (search rows included) and the live tree equal a rebuild from the
        version records; the rows rebuilt and the store's counters.

        The caller holds the store lock: a temp file among the versions is a dead writer's.
        """
        self.remove_temp_versions(store_dir)
        content = rows_from_records(self.load_records(store_dir))
        expected = self.expected_tree(store_dir, content)
        texts = {m.id: expected[m.path].decode("utf-8") for m in content.memories}
        with self.index(store_dir).write() as writer:
            writer.replace_all(content, texts)
            usage = writer.store_usage()
        self.index(store_dir).purge()
        self.sync_tree(store_dir, expected, apply=True)
        return content, usage
