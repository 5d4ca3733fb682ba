"""The memory stores' part of fsck.

Each store's derived files (the index, the live ``memories/`` tree) must equal a rebuild
from its records (``store.json``, ``versions/``); with ``repair`` they are rebuilt under
the store's lock. What cannot be rebuilt (an unreadable record, a forked version chain, a
planted link) is reported for a person, never guessed at and never followed. A store's
directory is named by its id: any other directory in ``_stores/`` is reported and left alone.
"""

from __future__ import annotations

import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from app.storage.core import record_rules, store_rules as rules
from app.storage.core.errors import (
    Corrupt,
    LockTimeout,
    NotFound,
    StorageError,
    Unreadable,
    UnsafePath,
)
from app.storage.core.models import FsckReport
from app.storage.core.names import STORE_ID_RE, STORES_DIR, TMP_PREFIX, Scope
from app.storage.core.store_records import VersionRecord
from app.storage.tree.fs.txn import Key
from app.storage.tree.fsck import quarantine
from app.storage.tree.sqlite import fts
from app.storage.tree.sqlite.store_index import IndexContent, rows_from_records
from app.storage.tree.stores.engine import MemoryStoreEngine

STALE_TEMP_SECONDS = 3600


def store_entries(engine: MemoryStoreEngine, links: list[Path]) -> Iterator[tuple[Scope, Path]]:
    """Every entry of every project's ``_stores/`` (links go to ``links``, not entered)."""
    for scope in engine.layout.projects(links):
        stores = engine.layout.stores_dir(scope)
        try:
            entries = engine.tree.entries(stores)
        except UnsafePath:
            links.append(stores)
            continue
        except NotADirectoryError:
            continue
        for entry in entries:
            if entry.is_link:
                links.append(entry.path)
            elif entry.is_dir:
                yield scope, entry.path


def all_stores(engine: MemoryStoreEngine, links: list[Path]) -> list[tuple[Scope, str]]:
    """(scope, store id) of every store directory named in the current layout."""
    return [
        (scope, path.name)
        for scope, path in store_entries(engine, links)
        if STORE_ID_RE.fullmatch(path.name)
    ]


class StoresFsck:
    def __init__(self, engine: MemoryStoreEngine, report: FsckReport, repair: bool) -> None:
        self.engine = engine
        self.report = report
        self.repair = repair

    def problem(self, message: str, *, repairable: bool) -> None:
        self.report.problems.append(message)
        if self.repair and not repairable:
            self.report.unrepairable.append(message)

    def run(self) -> None:
        engine = self.engine
        links: list[Path] = []
        visited = set()
        for scope, path in list(store_entries(engine, links)):
            if path.name.startswith(TMP_PREFIX):
                self.temp_dir(path)
            elif STORE_ID_RE.fullmatch(path.name):
                visited.add((scope, path.name))
                self.store_locked(scope, path.name, path)
            else:
                self.problem(
                    f"{engine.rel(path)}: not a store directory (a store's is named by its id);"
                    " left alone",
                    repairable=False,
                )
        for link in links:
            if link.name.startswith(TMP_PREFIX):
                continue
            self.problem(
                f"{engine.rel(link)}: symlink (never followed; remove it by hand)",
                repairable=False,
            )
        self.in_flight_elsewhere(visited)

    def temp_dir(self, path: Path) -> None:
        st = self.engine.tree.lstat(path)
        if st is None or time.time() - st.st_mtime < STALE_TEMP_SECONDS:
            return  # a store creation may be in flight
        problem = f"{self.engine.rel(path)}: abandoned store creation"
        self.problem(problem, repairable=True)
        if self.repair:
            self.engine.tree.remove(path)
            self.report.repaired.append(problem)

    def store_locked(self, scope: Scope, store_id: str, store_dir: Path) -> None:
        engine = self.engine
        key = Key(scope, store_id)
        try:
            with engine.txns.locked(key, repair=False):
                if not engine.tree.is_dir(store_dir):
                    return  # deleted since we listed it
                torn: list[Path] = []
                problems = self.check(store_dir, torn)
                if engine.txns.is_pending(key):
                    problems.append(
                        f"{engine.rel(store_dir)}: write in flight left by a writer that died"
                    )
                self.report.problems.extend(problems)
                if self.repair and problems:
                    for path in torn:
                        quarantine(engine.tree, path)
                    if store_dir not in torn:  # else the whole store went to lost+found
                        engine.rebuild(store_dir, key)
                    engine.txns.settle(key)
                    # The same strings as the problems: the CLI matches them.
                    self.report.repaired.extend(problems)
        except (LockTimeout, UnsafePath, NotFound) as exc:
            self.problem(
                f"{scope.tenant}/{scope.project}/{STORES_DIR}/{store_id}: not checked ({exc})",
                repairable=False,
            )
        except Unreadable as exc:
            # Not damage (app/storage/tree/fsck.py): the store is left exactly as it is.
            message = (
                f"{engine.rel(Path(exc.filename))}: cannot be read now ({exc.strerror}): an I/O"
                f" or permission error, not damage; store {store_id} was neither checked nor"
                " changed"
            )
            self.problem(message, repairable=False)
            self.report.unreadable.append(message)

    def check(self, store_dir: Path, torn: list[Path] | None = None) -> list[str]:
        """The repairable problems of one store; the others go to the report directly.

        A version record that cannot be read (``torn``) is repairable: a write acknowledged
        its record only once it was whole on disk (fsynced, or covered by a group flush), so
        an empty or cut one is a write that never got its answer, which a power cut caught
        before its flush (or a hand edit). The repair moves it to lost+found, for a person,
        and rebuilds the store from the others.
        """
        engine = self.engine
        rel = engine.rel(store_dir)
        try:
            rules.validate_name(engine.files.store_record(store_dir).name)
        except Unreadable:
            raise
        except (Corrupt, NotFound, UnsafePath, StorageError) as exc:
            record = engine.tree.lstat(engine.layout.store_record(store_dir))
            if record is not None and stat.S_ISREG(record.st_mode) and record.st_size == 0:
                # What a power cut leaves of a store created under group commit before its
                # flush: never acknowledged, and no version of it was either (each one's
                # flush would have covered the store). Edited by hand, it stays unrepairable.
                if torn is not None:
                    torn.append(store_dir)
                return [
                    f"{rel}: store record empty, a creation never acknowledged (store moved to lost+found)"
                ]
            self.problem(f"{rel}: store record unreadable ({exc})", repairable=False)
            return []
        unreadable: list[str] = []
        paths: list[Path] = []
        broken: list[str] = []
        records = engine.files.load_records(store_dir, unreadable, paths, broken)
        for item in broken:
            self.problem(item, repairable=False)
        problems: list[str] = []
        torn_rels = tuple(f"{engine.rel(path)}: " for path in paths)
        for item in unreadable:
            if item.startswith(torn_rels):
                problems.append(f"{item}; moved to lost+found")
            else:
                self.problem(item, repairable=False)  # a link: never moved, never read
        if torn is not None:
            torn.extend(paths)
        for item in chain_problems(records):
            self.problem(item, repairable=False)  # a fork cannot be rebuilt away
        expected = rows_from_records(records)
        problems += self.index_problems(store_dir, expected)
        links: list[str] = []
        tree = engine.files.expected_tree(store_dir, expected)
        for item in engine.files.sync_tree(store_dir, tree, False):
            (links if "symlink" in item else problems).append(item)
        for item in links:
            self.problem(item, repairable=False)
        for entry in engine.tree.entries(engine.layout.versions_dir(store_dir)):
            if entry.name.startswith(TMP_PREFIX):
                problems.append(f"{engine.rel(entry.path)}: leftover temp file")
        return problems

    def index_problems(self, store_dir: Path, expected: IndexContent) -> list[str]:
        engine = self.engine
        where = engine.rel(engine.layout.store_index(store_dir))
        try:
            with engine.index(store_dir).read() as reader:
                actual = reader.dump()
        except sqlite3.Error as exc:
            return [f"{where}: unreadable ({exc})"]
        problems = self.search_problems(store_dir, expected)
        if actual.memories != expected.memories:
            problems.append(f"{where}: memories differ from a rebuild")
        if actual.versions != expected.versions:
            problems.append(f"{where}: versions differ from a rebuild")
        if actual.last_id < expected.last_id or actual.last_us < expected.last_us:
            problems.append(f"{where}: last version behind the records")
        return problems

    def search_problems(self, store_dir: Path, expected: IndexContent) -> list[str]:
        """The search rows against the live memories' paths and head contents, and FTS5's own
        integrity check of the index against its stored text."""
        engine = self.engine
        where = engine.rel(engine.layout.store_index(store_dir))
        index = engine.index(store_dir)
        try:
            with index.read() as reader:
                if not reader.search_ready():
                    return [f"{where}: search index not built yet (or damaged: rebuilt)"]
                actual = reader.search_rows()
                orphans = reader.search_orphans()
            damage = index.search_damage()
            levels = index.search_levels()
        except sqlite3.Error as exc:
            return [f"{where}: search index unreadable ({exc})"]
        tree = engine.files.expected_tree(store_dir, expected)
        want = {m.id: (m.path, tree[m.path].decode("utf-8")) for m in expected.memories}
        problems = []
        if damage is not None:
            problems.append(f"{where}: search index damaged ({damage})")
        elif levels > fts.LEVEL_BOUND + 2:
            problems.append(
                f"{where}: search index structure has {levels} levels (a purge keeps at most"
                f" {fts.LEVEL_BOUND + 2})"
            )
        if actual != want or orphans:
            problems.append(f"{where}: search rows differ from the live memories")
        if index.purge_owed():
            problems.append(f"{where}: {fts.REMOVED_TEXT}")  # the rebuild purges it
        return problems

    def in_flight_elsewhere(self, visited: set[tuple[Scope, str]]) -> None:
        """Writes in flight on stores that are gone: clear them (nothing is left to repair)."""
        txns = self.engine.txns
        try:
            pending = txns.journal.pending()
        except UnsafePath:
            return  # a linked lock tree: reported by the check of the root, never entered
        for _, key in pending:
            if (key.scope, key.id) in visited:
                continue
            problem = (
                f"{key.scope.tenant}/{key.scope.project}/{STORES_DIR}/{key.id}: write in flight"
                " left by a writer that died, on a store that is gone"
            )
            self.report.problems.append(problem)
            if self.repair:
                with txns.locked(key):  # repairs (a no-op for a gone store) and clears
                    self.report.repaired.append(problem)


def chain_problems(records: list[VersionRecord]) -> list[str]:
    """Each version names the memory's previous one: a fork, a gap or a loop shows here."""
    return record_rules.chain_problems((r.id, r.memory_id, r.previous_version_id) for r in records)


def fsck_stores(engine: MemoryStoreEngine, report: FsckReport, *, repair: bool = False) -> None:
    """Check every store against a rebuild from its records; with ``repair``, rebuild."""
    StoresFsck(engine, report, repair).run()
