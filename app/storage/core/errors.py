"""Errors raised by the storage engine and the use cases over it (app/services/);
app/web/errors.py maps them to HTTP."""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error the storage engine raises on purpose."""


class InvalidName(StorageError):
    """An id, name or path component breaks the naming rules."""

    def __init__(self, field: str, value: object, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.value = value
        self.message = message


class NotFound(StorageError):
    """The addressed task, turn or artifact does not exist (or has expired)."""


class UnsafePath(StorageError):
    """A path leaves the root or passes through a symlink someone planted in the tree."""


class NotOwner(StorageError):
    """Only the task's owner (or a project admin) may do this."""


class SecretsRefused(StorageError):
    """A write that holds secrets, in a project whose policy refuses them
    (core/secret_policy.py): ``findings`` says each one's kind and where it is (a field, and
    the characters in it), never its value."""

    def __init__(self, findings: list[dict[str, object]]) -> None:
        kinds = sorted({str(f["kind"]) for f in findings})
        super().__init__(
            f"the write holds {len(findings)} secret(s) ({', '.join(kinds)}) and this project"
            " refuses secrets: nothing was stored"
        )
        self.findings = findings


class Forbidden(StorageError):
    """The principal's role does not allow this change (app/services/access.py)."""


class Conflict(StorageError):
    """The operation conflicts with the current state."""


class PreconditionFailed(StorageError):
    """An If-Match / If-None-Match precondition does not hold."""


class PayloadTooLarge(StorageError):
    """A body exceeds its documented limit."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class LockTimeout(StorageError):
    """A lock stayed busy for longer than the configured timeout."""

    retry_after = 1


class SearchTimeout(StorageError):
    """A search ran out of its time budget (MEMORY_SEARCH_TIMEOUT) before it could answer."""

    retry_after = 1


class SearchRebuilding(StorageError):
    """A search index is being rebuilt from the records (it was found damaged): searches of
    its project answer again once it holds every row."""

    retry_after = 5


class InsufficientStorage(StorageError):
    """The disk (or quota) is full: ENOSPC / EDQUOT."""


class Corrupt(StorageError):
    """A stored record was read and does not parse; fsck reports and repairs what it can."""


class Unreadable(StorageError, OSError):
    """A stored file cannot be read now: an I/O or permission error (EIO, EACCES, ENOMEM,
    EMFILE ...), not damage. Nothing is repaired or moved because of it: the API answers
    503, fsck reports it (and exits 1) until the file reads again. Also an OSError, with the
    errno and the path of the failed call."""

    def __init__(self, err: int, strerror: str, filename: str) -> None:
        OSError.__init__(self, err, strerror, filename)

    def __str__(self) -> str:
        return f"{self.filename}: cannot be read now ({self.strerror})"

    @classmethod
    def of(cls, exc: OSError, path: object = None) -> Unreadable:
        """``exc``, met reading ``path``, as an Unreadable."""
        if isinstance(exc, Unreadable):
            return exc
        where = exc.filename if exc.filename is not None else path
        return cls(exc.errno or 0, exc.strerror or str(exc), str(where))


class NotSupported(StorageError):
    """This backend does not offer the operation (yet)."""
