"""Per-tenant and per-project limit overrides: one small JSON file under the storage root.

``<root>/.limits.json``::

    {
      "version": 1,
      "tenants": {"acme": {"rate": {"rps": 50}}},
      "projects": {
        "acme/web": {"rate": {"rps": 200, "burst": 400,
                              "upload_bps": 10485760, "upload_burst": 52428800}}
      }
    }

An entry holds one section per kind of limit: ``"rate"`` (the rate limits, app/web/ratelimit.py)
and ``"quota"`` (the storage quotas, core/usage.py). Each command changes only its
own section and keeps every other section (and every other top-level key) as it found it. Changes are made under a lock in the lock tree and written
atomically (temp file, rename); readers never lock. A server re-reads the file when its
inode, size or mtime changes (:meth:`LimitsFile.stamp`).

Rate fields, all optional and all >= 0: ``rps`` (requests per second, fractions allowed),
``burst`` (requests at once), ``upload_bps`` (request body bytes per second of writes),
``upload_burst`` (body bytes at once). A rate of 0 means no limit; a burst needs the rate of
its pair in the same entry.

Quota fields, both optional, both whole numbers >= 0: ``bytes`` (what the project or the
tenant may store) and ``tasks`` (how many tasks it may hold). A project's entry limits that
project and a tenant's entry limits the sum of its projects: both apply to every write. A
quota of 0 lets nothing more be stored; a field that is absent sets no limit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields
from typing import Any

from app.storage.core.encoding import dumps
from app.storage.core.errors import InvalidName, StorageError
from app.storage.core.names import validate_id

VERSION = 1
RATE = "rate"
QUOTA = "quota"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1 << 30,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


class LimitsFileError(StorageError):
    """The limits file, or a change asked of it, breaks the rules above."""


def parse_bytes(value: object) -> int:
    """A byte count from an int or a text with an optional unit: ``10MiB``, ``1.5GB``, ``512k``.

    k/M/G and kB/MB/GB are powers of 1000, KiB/MiB/GiB powers of 1024 (any case).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte count")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    if isinstance(value, float):
        value = repr(value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a byte count")
    match = _SIZE_RE.fullmatch(value)
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(f"{value!r} is not a byte count (e.g. 1048576, 10MiB, 1.5GB)")
    return round(float(match.group(1)) * unit)


def format_bytes(count: int) -> str:
    """``count`` in the largest binary unit that divides it exactly: ``10MiB``, ``1536KiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def human_bytes(count: int) -> str:
    """``count`` for a person to read: ``812 byte(s)``, ``1.5 KiB``, ``70.4 GiB`` (one unit,
    rounded; :func:`format_bytes` is the exact form that settings take)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} byte(s)"


@dataclass(frozen=True, slots=True)
class RateOverride:
    """The ``"rate"`` section of one entry; None: not set here."""

    rps: float | None = None
    burst: int | None = None
    upload_bps: int | None = None
    upload_burst: int | None = None

    def to_json(self) -> dict[str, float | int]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def merged(self, change: RateOverride) -> RateOverride:
        """This section with every field ``change`` sets replaced."""
        return RateOverride(**{**self.to_json(), **change.to_json()})  # type: ignore[arg-type]

    @property
    def empty(self) -> bool:
        return not self.to_json()


@dataclass(frozen=True, slots=True)
class RateOverrides:
    """Every ``"rate"`` section of the file, by tenant and by (tenant, project)."""

    tenants: Mapping[str, RateOverride]
    projects: Mapping[tuple[str, str], RateOverride]


NO_OVERRIDES = RateOverrides({}, {})


@dataclass(frozen=True, slots=True)
class QuotaOverride:
    """The ``"quota"`` section of one entry; None: no limit of that kind here."""

    bytes: int | None = None
    tasks: int | None = None

    def to_json(self) -> dict[str, int]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def merged(self, change: QuotaOverride) -> QuotaOverride:
        """This section with every field ``change`` sets replaced."""
        return QuotaOverride(**{**self.to_json(), **change.to_json()})

    def without(self, names: tuple[str, ...]) -> QuotaOverride:
        return QuotaOverride(**{k: v for k, v in self.to_json().items() if k not in names})

    @property
    def empty(self) -> bool:
        return not self.to_json()


@dataclass(frozen=True, slots=True)
class Quotas:
    """Every ``"quota"`` section of the file, by tenant and by (tenant, project)."""

    tenants: Mapping[str, QuotaOverride]
    projects: Mapping[tuple[str, str], QuotaOverride]

    def of(self, tenant: str, project: str) -> tuple[QuotaOverride | None, QuotaOverride | None]:
        """The quotas a write in ``tenant/project`` answers to: the project's, the tenant's."""
        return self.projects.get((tenant, project)), self.tenants.get(tenant)


NO_QUOTAS = Quotas({}, {})


def rate_from_json(obj: object, where: str) -> RateOverride:
    """Check a ``"rate"`` section; raise LimitsFileError naming ``where`` when it is wrong."""
    if not isinstance(obj, dict):
        raise LimitsFileError(f"{where}: the rate section must be an object")
    unknown = sorted(set(obj) - {f.name for f in fields(RateOverride)})
    if unknown:
        raise LimitsFileError(f"{where}: unknown rate field(s) {', '.join(unknown)}")
    values: dict[str, float | int] = {}
    for name, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LimitsFileError(f"{where}: {name} must be a number")
        if not math.isfinite(value) or value < 0:
            raise LimitsFileError(f"{where}: {name} must be a finite number >= 0")
        if name != "rps":
            if value != int(value):
                raise LimitsFileError(f"{where}: {name} must be a whole number")
            value = int(value)
        values[name] = value
    for burst, rate in (("burst", "rps"), ("upload_burst", "upload_bps")):
        if burst in values and rate not in values:
            raise LimitsFileError(f"{where}: {burst} needs {rate} in the same entry")
    return RateOverride(**values)  # type: ignore[arg-type]


def quota_from_json(obj: object, where: str) -> QuotaOverride:
    """Check a ``"quota"`` section; raise LimitsFileError naming ``where`` when it is wrong."""
    if not isinstance(obj, dict):
        raise LimitsFileError(f"{where}: the quota section must be an object")
    unknown = sorted(set(obj) - {f.name for f in fields(QuotaOverride)})
    if unknown:
        raise LimitsFileError(f"{where}: unknown quota field(s) {', '.join(unknown)}")
    for name, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise LimitsFileError(f"{where}: {name} must be a whole number >= 0")
    return QuotaOverride(**obj)


def project_key(tenant: str, project: str) -> str:
    return f"{tenant}/{project}"


def _entries(doc: dict[str, Any], section: str) -> dict[str, Any]:
    entries = doc.get(section, {})
    if not isinstance(entries, dict):
        raise LimitsFileError(f"{section} must be an object")
    return entries


def check_document(doc: object) -> RateOverrides:
    """Validate a whole file's content; return its rate sections."""
    rates, _ = check_sections(doc)
    return rates


def quotas_of(doc: object) -> Quotas:
    """Validate a whole file's content; return its quota sections."""
    _, quotas = check_sections(doc)
    return quotas


def check_sections(doc: object) -> tuple[RateOverrides, Quotas]:
    """Validate a whole file's content; return its rate and quota sections."""
    if not isinstance(doc, dict):
        raise LimitsFileError("the file must hold a JSON object")
    if doc.get("version") != VERSION:
        raise LimitsFileError(f"unsupported version {doc.get('version')!r} (expected {VERSION})")
    tenants: dict[str, RateOverride] = {}
    projects: dict[tuple[str, str], RateOverride] = {}
    tenant_quotas: dict[str, QuotaOverride] = {}
    project_quotas: dict[tuple[str, str], QuotaOverride] = {}
    try:
        for key, entry in _entries(doc, "tenants").items():
            if not isinstance(entry, dict):
                raise LimitsFileError(f"tenants.{key}: must be an object")
            validate_id("tenant", key)
            if RATE in entry:
                tenants[key] = rate_from_json(entry[RATE], f"tenants.{key}")
            if QUOTA in entry:
                tenant_quotas[key] = quota_from_json(entry[QUOTA], f"tenants.{key}")
        for key, entry in _entries(doc, "projects").items():
            if not isinstance(entry, dict):
                raise LimitsFileError(f"projects.{key}: must be an object")
            tenant, slash, project = key.partition("/")
            if not slash:
                raise LimitsFileError(f"projects.{key}: the key must be 'tenant/project'")
            validate_id("tenant", tenant)
            validate_id("project", project)
            if RATE in entry:
                projects[(tenant, project)] = rate_from_json(entry[RATE], f"projects.{key}")
            if QUOTA in entry:
                project_quotas[(tenant, project)] = quota_from_json(entry[QUOTA], f"projects.{key}")
    except InvalidName as exc:
        raise LimitsFileError(f"bad name in the limits file: {exc}") from None
    return RateOverrides(tenants, projects), Quotas(tenant_quotas, project_quotas)


def set_quota_in(
    doc: dict[str, Any], section: str, key: str, change: QuotaOverride
) -> QuotaOverride:
    """Set the fields ``change`` gives in the quota section of ``doc[section][key]``; return
    the section as it now is (the caller writes ``doc`` back)."""
    where = f"{section}.{key}"
    entry = doc.setdefault(section, {}).setdefault(key, {})
    current = quota_from_json(entry.get(QUOTA, {}), where)
    updated = quota_from_json(current.merged(change).to_json(), where)
    entry[QUOTA] = updated.to_json()
    return updated


def clear_quota_in(doc: dict[str, Any], section: str, key: str, names: tuple[str, ...]) -> bool:
    """Drop the fields ``names`` of the quota section of ``doc[section][key]`` (the section
    goes when it is left empty, the entry when nothing else is in it); False when none was set."""
    entries = doc.get(section, {})
    entry = entries.get(key)
    if entry is None or QUOTA not in entry:
        return False
    current = quota_from_json(entry[QUOTA], f"{section}.{key}")
    kept = current.without(names)
    if kept == current:
        return False
    if kept.empty:
        del entry[QUOTA]
    else:
        entry[QUOTA] = kept.to_json()
    if not entry:  # other kinds of limit keep the entry alive
        del entries[key]
    return True


def empty_document() -> dict[str, Any]:
    """The document of a deployment that overrides nothing."""
    return {"version": VERSION, "projects": {}, "tenants": {}}


class LimitEdits:
    """A limits document and its edits, whichever store keeps it (the tree's file,
    tree/limits.py; PostgreSQL's row, pg/limits.py), over two primitives of the store:
    ``document`` (read it, checked) and ``_held`` (hold it for one change: yield the
    document as stored, and the call that writes its new bytes). Each edit reads, changes and
    writes back the whole document at once, and tells the ``listeners`` (this process applies
    a change at once; the others see the store's stamp move within a second)."""

    listeners: list[Callable[[], None]]

    def document(self) -> dict[str, Any]:
        raise NotImplementedError

    def _held(self) -> AbstractContextManager[tuple[dict[str, Any], Callable[[bytes], None]]]:
        raise NotImplementedError

    def rates(self) -> RateOverrides:
        """Every rate override of the document (none when there is none)."""
        return check_document(self.document())

    def quotas(self) -> Quotas:
        """Every quota of the document (none when there is none)."""
        return quotas_of(self.document())

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """Yield the current document, held; write it back if the block changed it."""
        with self._held() as (doc, write):
            before = dumps(doc)
            yield doc
            check_document(doc)
            after = dumps(doc)
            if after != before:
                write(after)
        for listener in self.listeners:
            listener()

    def _entry_path(self, tenant: str, project: str | None) -> tuple[str, str]:
        try:
            validate_id("tenant", tenant)
            if project is None:
                return "tenants", tenant
            validate_id("project", project)
        except InvalidName as exc:
            raise LimitsFileError(str(exc)) from None
        return "projects", project_key(tenant, project)

    def set_rate(self, tenant: str, project: str | None, change: RateOverride) -> RateOverride:
        """Set the fields ``change`` gives for a project (or, without one, a tenant's default);
        keep the entry's other fields. Return the entry's rate section as written."""
        section, key = self._entry_path(tenant, project)
        where = f"{section}.{key}"
        with self._changing() as doc:
            entries = doc.setdefault(section, {})
            entry = entries.setdefault(key, {})
            current = rate_from_json(entry.get(RATE, {}), where)
            updated = rate_from_json(current.merged(change).to_json(), where)
            entry[RATE] = updated.to_json()
        return updated

    def clear_rate(self, tenant: str, project: str | None) -> bool:
        """Drop the rate section of a project (or tenant) entry; False when there was none."""
        section, key = self._entry_path(tenant, project)
        with self._changing() as doc:
            entries = doc.get(section, {})
            entry = entries.get(key)
            if entry is None or RATE not in entry:
                return False
            del entry[RATE]
            if not entry:  # other kinds of limit keep the entry alive
                del entries[key]
        return True

    def set_quota(self, tenant: str, project: str | None, change: QuotaOverride) -> QuotaOverride:
        """Set the quota fields ``change`` gives for a project (or, without one, for the
        tenant's total); keep the entry's other fields. Return the section as written."""
        section, key = self._entry_path(tenant, project)
        with self._changing() as doc:
            return set_quota_in(doc, section, key, change)

    def clear_quota(
        self, tenant: str, project: str | None, names: tuple[str, ...] = ("bytes", "tasks")
    ) -> bool:
        """Drop quota fields of a project (or tenant) entry; False when none of them was set."""
        section, key = self._entry_path(tenant, project)
        with self._changing() as doc:
            return clear_quota_in(doc, section, key, names)
