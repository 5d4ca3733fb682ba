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

An entry holds one section per kind of limit: ``"rate"`` (the rate limits, app/web/ratelimit/),
``"quota"`` (the storage quotas, core/usage.py), ``"secrets"`` (what a write's secrets
become, core/secret_policy.py) and, in a project's entry, ``"prices"`` (what its ledger
prices each model's tokens at, core/ledger.py). Each command changes only its
own section and keeps every other section (and every other top-level key) as it found it. Changes are made under a lock in the lock tree and written
atomically (temp file, rename); readers never lock. A server re-reads the file when its
inode, size or mtime changes (:meth:`LimitsFile.stamp`).

Rate fields, all optional and all >= 0: ``rps`` (requests per second, fractions allowed, at
most 1,000,000), ``burst`` (requests at once, at most 1,000,000), ``upload_bps`` (request body
bytes per second of writes, at most 1 TiB) and ``upload_burst`` (body bytes at once, at most
1 TiB). A rate of 0 means no limit; a burst of 0 means one second's worth (at least one); a
burst needs the rate of its pair in the same entry; and an empty budget refills within a day
(burst / rate <= 86,400 s), so a refusal never asks a client to wait longer than that.

Quota fields, both optional, both whole numbers >= 0: ``bytes`` (what the project or the
tenant may store) and ``tasks`` (how many tasks it may hold). A project's entry limits that
project and a tenant's entry limits the sum of its projects: both apply to every write. A
quota of 0 lets nothing more be stored; a field that is absent sets no limit.

A change that breaks these rules is refused (:class:`InvalidLimit`). An entry of the stored
document that breaks them (a file edited by hand, a rule made stricter since it was written)
limits nothing: readers leave it out and name it in ``skipped``, so it never changes how
another project is limited, and a change to it replaces it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields
from typing import Any

from app.storage.core import ledger, secret_policy
from app.storage.core.encoding import dumps
from app.storage.core.errors import InvalidName, StorageError
from app.storage.core.ledger import Price, PriceSettings
from app.storage.core.names import validate_id
from app.storage.core.secret_policy import SecretSettings, SecretsOverride

VERSION = 1
RATE = "rate"
QUOTA = "quota"
SECRETS = "secrets"
PRICES = ledger.PRICES
#: Upper bounds of the rate fields, and the longest an empty budget may take to refill.
MAX_RPS = 1_000_000
MAX_BURST = 1_000_000
MAX_UPLOAD_BYTES = 1 << 40
MAX_REFILL_SECONDS = 86_400
_MAXIMA = {"rps": MAX_RPS, "burst": MAX_BURST, "upload_bps": MAX_UPLOAD_BYTES}
_MAXIMA["upload_burst"] = MAX_UPLOAD_BYTES
PAIRS = (("rps", "burst"), ("upload_bps", "upload_burst"))

log = logging.getLogger("app.storage.limits")

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


class InvalidLimit(LimitsFileError):
    """A change asked of the limits breaks the rules above: the asker's mistake."""


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
    """Every ``"rate"`` section of the file, by tenant and by (tenant, project); ``skipped``:
    why each entry that breaks the rules was left out."""

    tenants: Mapping[str, RateOverride]
    projects: Mapping[tuple[str, str], RateOverride]
    skipped: tuple[str, ...] = ()


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
    """Every ``"quota"`` section of the file, by tenant and by (tenant, project); ``skipped``:
    why each entry that breaks the rules was left out."""

    tenants: Mapping[str, QuotaOverride]
    projects: Mapping[tuple[str, str], QuotaOverride]
    skipped: tuple[str, ...] = ()

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
    for rate, burst in PAIRS:
        if burst in values and rate not in values:
            raise LimitsFileError(f"{where}: {burst} needs {rate} in the same entry")
        fault = rate_fault(rate, values.get(rate, 0), burst, values.get(burst, 0))
        if fault:
            raise LimitsFileError(f"{where}: {fault}")
    return RateOverride(**values)  # type: ignore[arg-type]


def rate_fault(rate_name: str, rate: float, burst_name: str, burst: float) -> str | None:
    """Why a rate and its burst are out of range (the module's rules), or None. Also checks
    the MEMORY_RATE_LIMIT_* settings (app/config.py)."""
    for name, value in ((rate_name, rate), (burst_name, burst)):
        if value > _MAXIMA[name]:
            return f"{name} must be at most {_MAXIMA[name]:,}"
    if rate <= 0:
        return None
    refill = (burst or max(1, math.ceil(rate))) / rate
    if refill > MAX_REFILL_SECONDS:
        return (
            f"{rate_name} {rate:g} with {burst_name} {burst or 'of one second'} takes"
            f" {refill:.3g} s to refill; it must refill within {MAX_REFILL_SECONDS:,} s"
            f" ({rate_name} >= {burst_name} / {MAX_REFILL_SECONDS:,})"
        )
    return None


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


def check_document(doc: object) -> None:
    """Check what a whole document must be for any of it to be read: an object of this
    version whose ``tenants`` and ``projects`` are objects (its entries are checked one by
    one, by :func:`check_sections` and by each change)."""
    if not isinstance(doc, dict):
        raise LimitsFileError("the file must hold a JSON object")
    if doc.get("version") != VERSION:
        raise LimitsFileError(f"unsupported version {doc.get('version')!r} (expected {VERSION})")
    _entries(doc, "tenants")
    _entries(doc, "projects")


def quotas_of(doc: object) -> Quotas:
    """A whole document's quota sections (entries that break the rules left out)."""
    _, quotas = check_sections(doc)
    return quotas


def _entry_key(section: str, key: str) -> tuple[str, str] | str:
    """The tenant, or (tenant, project), an entry's key names; LimitsFileError when none."""
    try:
        if section == "tenants":
            return validate_id("tenant", key)
        tenant, slash, project = key.partition("/")
        if not slash:
            raise LimitsFileError(f"projects.{key}: the key must be 'tenant/project'")
        return validate_id("tenant", tenant), validate_id("project", project)
    except InvalidName as exc:
        raise LimitsFileError(f"bad name in the limits file: {exc}") from None


def check_sections(doc: object, *, strict: bool = False) -> tuple[RateOverrides, Quotas]:
    """A whole document's rate and quota sections.

    Each section that breaks the rules is left out and named in its kind's ``skipped`` (an
    entry whose key or shape is wrong, in both): one bad entry must not change how any other
    project is limited, nor keep the others from being read. ``strict``: raise
    LimitsFileError naming the first one instead.
    """
    rates = _kind_sections(doc, RATE, rate_from_json, strict)
    quotas = _kind_sections(doc, QUOTA, quota_from_json, strict)
    return RateOverrides(*rates), Quotas(*quotas)


def secret_settings_of(doc: object, *, strict: bool = False) -> SecretSettings:
    """A whole document's secrets sections (core/secret_policy.py), left out and named in
    ``skipped`` as :func:`check_sections` leaves out the others."""

    return SecretSettings(*_kind_sections(doc, SECRETS, secrets_from_json, strict))


def price_settings_of(doc: object, *, strict: bool = False) -> PriceSettings:
    """A whole document's price tables (core/ledger.py), left out and named in ``skipped``
    as :func:`check_sections` leaves out the others; a tenant's entry holds none."""
    tenants, projects, skipped = _kind_sections(doc, PRICES, prices_from_json, strict)
    for tenant in tenants:
        fault = f"tenants.{tenant}: prices are set per project"
        if strict:
            raise LimitsFileError(fault)
        skipped += (fault,)
    return PriceSettings(projects, skipped)


def prices_from_json(obj: object, where: str) -> dict[str, Price]:
    """Check a ``"prices"`` section as the other kinds are checked (LimitsFileError)."""
    try:
        return ledger.prices_from_json(obj, where)
    except ledger.PriceTableError as exc:
        raise LimitsFileError(str(exc)) from None


def secrets_from_json(obj: object, where: str) -> SecretsOverride:
    """Check a ``"secrets"`` section as the other kinds are checked (LimitsFileError)."""
    try:
        return secret_policy.from_json(obj, where)
    except secret_policy.SecretsSectionError as exc:
        raise LimitsFileError(str(exc)) from None


def _kind_sections(
    doc: object, kind: str, parse: Callable[[object, str], Any], strict: bool
) -> tuple[dict[str, Any], dict[tuple[str, str], Any], tuple[str, ...]]:
    """The sections ``kind`` of every entry: (by tenant, by (tenant, project), why each one
    left out was); ``strict``: LimitsFileError for the first one left out."""
    check_document(doc)
    assert isinstance(doc, dict)
    tenants: dict[str, Any] = {}
    projects: dict[tuple[str, str], Any] = {}
    skipped: list[str] = []
    for section in ("tenants", "projects"):
        for key, entry in _entries(doc, section).items():
            where = f"{section}.{key}"
            try:
                if not isinstance(entry, dict):
                    raise LimitsFileError(f"{where}: must be an object")
                name = _entry_key(section, key)
                if kind not in entry:
                    continue
                found = parse(entry[kind], where)
            except LimitsFileError as exc:
                if strict:
                    raise
                skipped.append(str(exc))
                continue
            if isinstance(name, str):
                tenants[name] = found
            else:
                projects[name] = found
    return tenants, projects, tuple(skipped)


def _entry_of(doc: dict[str, Any], section: str, key: str) -> dict[str, Any]:
    """The entry ``doc[section][key]`` for a change, made when absent; one that is not an
    object limits nothing, and the change replaces it."""
    entries = doc.setdefault(section, {})
    entry = entries.get(key)
    if isinstance(entry, dict):
        return entry
    made: dict[str, Any] = {}
    entries[key] = made
    return made


def _stored(
    parse: Callable[[object, str], Any], entry: dict[str, Any], kind: str, where: str
) -> Any:
    """The section ``kind`` of ``entry`` as stored, or None when it breaks the rules (a change
    replaces it rather than failing on it)."""
    try:
        return parse(entry.get(kind, {}), where)
    except LimitsFileError as exc:
        log.warning("limits: replacing a section that breaks the rules: %s", exc)
        return None


def _asked(parse: Callable[[object, str], Any], obj: object, where: str) -> Any:
    """The section a change asks for, checked: InvalidLimit naming the fault."""
    try:
        return parse(obj, where)
    except LimitsFileError as exc:
        raise InvalidLimit(str(exc)) from None


def set_quota_in(
    doc: dict[str, Any], section: str, key: str, change: QuotaOverride
) -> QuotaOverride:
    """Set the fields ``change`` gives in the quota section of ``doc[section][key]``; return
    the section as it now is (the caller writes ``doc`` back)."""
    where = f"{section}.{key}"
    entry = _entry_of(doc, section, key)
    current = _stored(quota_from_json, entry, QUOTA, where) or QuotaOverride()
    updated: QuotaOverride = _asked(quota_from_json, current.merged(change).to_json(), where)
    entry[QUOTA] = updated.to_json()
    return updated


def clear_quota_in(doc: dict[str, Any], section: str, key: str, names: tuple[str, ...]) -> bool:
    """Drop the fields ``names`` of the quota section of ``doc[section][key]`` (the section
    goes when it is left empty, the entry when nothing else is in it); False when none was set."""
    entries = doc.get(section, {})
    entry = entries.get(key)
    if not isinstance(entry, dict):  # an entry that is no object limits nothing: it goes
        return entries.pop(key, None) is not None
    if QUOTA not in entry:
        return False
    current = _stored(quota_from_json, entry, QUOTA, f"{section}.{key}")
    kept = QuotaOverride() if current is None else current.without(names)
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
        """Every rate override of the document (none when there is none), the entries that
        break the rules left out (``skipped``)."""
        rates, _ = check_sections(self.document())
        return rates

    def quotas(self) -> Quotas:
        """Every quota of the document (none when there is none), the entries that break the
        rules left out (``skipped``)."""
        return quotas_of(self.document())

    def secrets(self) -> SecretSettings:
        """Every secrets section of the document (core/secret_policy.py), the entries that
        break the rules left out (``skipped``)."""
        return secret_settings_of(self.document())

    def prices(self) -> PriceSettings:
        """Every project's price table (core/ledger.py), the entries that break the rules
        left out (``skipped``)."""
        return price_settings_of(self.document())

    def set_prices(self, tenant: str, project: str, table: object) -> dict[str, Price]:
        """Replace a project's price table with ``table`` (its JSON; an empty one removes
        it); return it as written. InvalidLimit for one that breaks core/ledger.py's rules."""
        section, key = self._entry_path(tenant, project)
        where = f"{section}.{key}.{PRICES}"
        written: dict[str, Price] = _asked(prices_from_json, table, where)
        with self._changing() as doc:
            entry = _entry_of(doc, section, key)
            if written:
                entry[PRICES] = ledger.prices_to_json(written)
            else:
                entry.pop(PRICES, None)
                if not entry:
                    del doc[section][key]
        return written

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
            raise InvalidLimit(str(exc)) from None
        return "projects", project_key(tenant, project)

    def set_rate(self, tenant: str, project: str | None, change: RateOverride) -> RateOverride:
        """Set the fields ``change`` gives for a project (or, without one, a tenant's default);
        keep the entry's other fields. Return the entry's rate section as written."""
        section, key = self._entry_path(tenant, project)
        where = f"{section}.{key}"
        with self._changing() as doc:
            entry = _entry_of(doc, section, key)
            current = _stored(rate_from_json, entry, RATE, where) or RateOverride()
            updated: RateOverride = _asked(rate_from_json, current.merged(change).to_json(), where)
            entry[RATE] = updated.to_json()
        return updated

    def clear_rate(self, tenant: str, project: str | None) -> bool:
        """Drop the rate section of a project (or tenant) entry; False when there was none."""
        section, key = self._entry_path(tenant, project)
        with self._changing() as doc:
            entries = doc.get(section, {})
            entry = entries.get(key)
            if not isinstance(entry, dict):  # an entry that is no object limits nothing: it goes
                return entries.pop(key, None) is not None
            if RATE not in entry:
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

    def set_secrets(
        self, tenant: str, project: str | None, change: SecretsOverride
    ) -> SecretsOverride:
        """Set the fields ``change`` gives in the secrets section of a project (or, without
        one, of the tenant, which its projects inherit); keep the others. Return the section
        as written."""
        section, key = self._entry_path(tenant, project)
        where = f"{section}.{key}"
        with self._changing() as doc:
            entry = _entry_of(doc, section, key)
            current = _stored(secrets_from_json, entry, SECRETS, where) or SecretsOverride()
            updated: SecretsOverride = _asked(
                secrets_from_json, current.merged(change).to_json(), where
            )
            if updated.empty:
                entry.pop(SECRETS, None)
                if not entry:
                    del doc[section][key]
            else:
                entry[SECRETS] = updated.to_json()
        return updated
