"""Every name of the stored data, and the rules ids and names follow.

The ids a request may use (tenant, project, task, artifact, turn; the memory stores' ids),
validated before any of them reaches a path or a query, and every file and directory name
the tree writes (tree/fs/layout.py builds the paths from them), which the backup
archive (core/archive.py) and the object store keys of PostgreSQL + S3
(pg/blobs.py) reuse, so that each is spelled once (tests/test_layout_names.py).

Ids start with an ASCII letter or digit, so names starting with ``.`` or ``_`` can never
collide with a tenant, project or task: a task called ``project.md`` or ``index.json`` works.
Temp files carry ``~``, which no id or artifact name may contain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.storage.core.errors import InvalidName

ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
ARTIFACT_NAME_PATTERN = r"[A-Za-z0-9._-]{1,128}"
MAX_TURN = 9999
_ULID = r"[0-9A-HJKMNP-TV-Z]{26}"
STORE_ID_PATTERN = rf"memstore_{_ULID}"
MEMORY_ID_PATTERN = rf"mem_{_ULID}"
VERSION_ID_PATTERN = rf"memver_{_ULID}"

_ID_RE = re.compile(ID_PATTERN)
_ARTIFACT_RE = re.compile(ARTIFACT_NAME_PATTERN)
STORE_ID_RE = re.compile(STORE_ID_PATTERN)
MEMORY_ID_RE = re.compile(MEMORY_ID_PATTERN)
VERSION_ID_RE = re.compile(VERSION_ID_PATTERN)

TASK_RECORD = "task.json"
TURN_META = "meta.json"
TURN_SUMMARY = "summary.md"
ARTIFACTS_DIR = "artifacts"
TASK_INDEX = "index.json"
PROJECT_DIGEST = "_project.md"
PROJECT_LISTING = "_listing.sqlite3"
PROJECT_LEDGER = "_ledger.sqlite3"  # the turn ledger: tree/sqlite/ledger.py
STORES_DIR = "_stores"
STORE_RECORD = "store.json"
VERSIONS_DIR = "versions"
MEMORIES_DIR = "memories"
STORE_INDEX = "index.sqlite3"
LOCKS_DIR = ".locks"
TRASH_DIR = ".trash"
# An export's snapshot in the trash, "<ULID>-snapshot-<task or store id>": read while the export
# runs, it is never removed before its grace period.
TRASH_SNAPSHOT = "snapshot-"
CURSOR_KEY = ".cursor-key"
CONSOLE_KEY = ".console-key"
SENTINEL = ".server-running"
SERVER_LOCK = "_server.lock"
CANARY = "_canary"
RECOVERING = "_recovering"
LIMITS_FILE = ".limits.json"  # rate limit (and other limit) overrides: core/limits.py
TRAFFIC_DB = ".traffic.sqlite3"  # requests and bytes per hour, project and token: tree/usage.py
AUDIT_DB = ".audit.sqlite3"  # who did what, per project: tree/audit.py
OAUTH_DIR = ".oauth"  # OAuth grants and registered clients: tree/oauth.py
USERS_DIR = ".users"  # the people who sign in with an identity provider: tree/users.py
OAUTH_KEY = ".oauth-key"  # signs OAuth access tokens
TMP_PREFIX = ".~tmp-"
# An artifact's acknowledged bytes, kept (hard-linked) while a replacement is between
# publishing its bytes and committing meta.json; repair puts it back when the commit is lost.
PREV_PREFIX = f"{TMP_PREFIX}prev-"
# Lock stripes of the two engines: names no id can take (ids never start with "_"), so they
# never meet the per-project lock directories beside them.
TASK_LOCKS = "_tasks"
STORE_LOCKS = "_stores"
LOCK_STRIPES = 1024
# ASCII digits only: \d would also match ٠١٢٣, and such a turn could never be addressed.
TURN_DIR_RE = re.compile(r"([0-9]{4})-turn")


def _check_common(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidName(field, value, "must be a string")
    if not value.isascii():
        raise InvalidName(field, value, "must be ASCII")
    return value


def validate_id(field: str, value: object) -> str:
    """Return ``value`` if it is a valid tenant, project or task id, else raise InvalidName."""
    text = _check_common(field, value)
    # The seed's pattern, whole: it starts with a letter or digit, so an id is never "." or
    # "..", and never one of the tree's own names beside it (they start with "." or "_"). A
    # trailing dot is an ordinary character on the Linux filesystems the tree runs on.
    if not _ID_RE.fullmatch(text):
        raise InvalidName(field, value, f"must match {ID_PATTERN}")
    return text


def validate_artifact_name(value: object) -> str:
    """Return ``value`` if it is a valid artifact name, else raise InvalidName."""
    text = _check_common("name", value)
    if not _ARTIFACT_RE.fullmatch(text):
        raise InvalidName("name", value, f"must match {ARTIFACT_NAME_PATTERN}")
    # The seed's pattern allows "." and "..", which name a directory, never a file in it.
    # Any other name is a file of its own in the turn's artifacts/ directory: one ending in
    # "." included, and none can take the server's temp names there, which hold a "~".
    if text in (".", ".."):
        raise InvalidName("name", value, "'.' and '..' are not artifact names")
    return text


def validate_turn(value: object) -> int:
    """Return ``value`` if it is a turn number in 0..9999, else raise InvalidName."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidName("turn", value, "must be an integer")
    if not 0 <= value <= MAX_TURN:
        raise InvalidName("turn", value, f"must be between 0 and {MAX_TURN}")
    return value


def is_id(name: str) -> bool:
    """Whether ``name`` is a valid tenant, project or task id."""
    try:
        validate_id("id", name)
    except InvalidName:
        return False
    return True


def turn_dirname(turn: int) -> str:
    return f"{turn:04d}-turn"


@dataclass(frozen=True, slots=True)
class Scope:
    """A validated tenant/project pair: every project-memory call is made inside one."""

    tenant: str
    project: str

    def __post_init__(self) -> None:
        validate_id("tenant", self.tenant)
        validate_id("project", self.project)

    @property
    def owner(self) -> str | None:
        """The user whose private space this is (None: the team's project)."""
        return private_owner(self.project)

    @property
    def team(self) -> Scope:
        """The team's project this scope is in: itself, or the project of a private space."""
        found = _PRIVATE_RE.fullmatch(self.project)
        return self if found is None else Scope(self.tenant, found["project"])


# -- private spaces --------------------------------------------------------------------------
# A user's private space in a project is a project of its own, named after both: every task,
# store, listing, search index, digest and ledger of it lives apart from the team's, on both
# backends, so no read of the team's project can meet it, whatever the read. The name is an
# ordinary id (the walks, fsck, backups and retention cover it as any project), reserved: no
# request, token or rule may name it (access.py chooses it from the token's user alone).
PRIVATE_SEPARATOR = ".."
USER_ID_PATTERN = r"usr_[0-9a-f]{32}"
_PRIVATE_RE = re.compile(rf"(?P<project>.+)\.\.(?P<user>{USER_ID_PATTERN})")
# The longest team project name a private space can be made for: the space's name is an id too.
MAX_PRIVATE_BASE = 128 - len(PRIVATE_SEPARATOR) - len("usr_") - 32


def private_owner(project: str) -> str | None:
    """The user whose private space ``project`` names, None for any other project."""
    found = _PRIVATE_RE.fullmatch(project)
    return None if found is None else found["user"]


def is_reserved_project(project: str) -> bool:
    """Whether ``project`` is a private space's name, which no request may name itself."""
    return private_owner(project) is not None


def private_scope(scope: Scope, user: str) -> Scope:
    """The private space of ``user`` in ``scope``'s project (InvalidName: a project name too
    long to have one, or a user id that is not one)."""
    team = scope.team
    if not re.fullmatch(USER_ID_PATTERN, user):
        raise InvalidName("user", user, f"must match {USER_ID_PATTERN}")
    if len(team.project) > MAX_PRIVATE_BASE:
        raise InvalidName(
            "project",
            team.project,
            f"a private space needs a project name of at most {MAX_PRIVATE_BASE} characters",
        )
    return Scope(team.tenant, f"{team.project}{PRIVATE_SEPARATOR}{user}")
