"""Secrets in what a door is asked to store, whichever door (the REST APIs, the console, the
MCP tools, the memory tool): found by core/secret_scan.py and then masked, refused or let
through by the project's policy (core/secret_policy.py), before the use case's one storage
call. So a secret never comes to rest under ``mask`` or ``reject``: not in a record, an
index, the digest, a version history or a backup.

A use case opens one :class:`Screen` per write, passes each text through it, then calls
:meth:`Screen.settle` before storing: under ``reject`` that raises SecretsRefused (a 422
naming each secret's kind and place, never its value) and nothing is written; under
``mask`` the use case stores the masked texts, and once the write succeeded
:meth:`Screen.record` adds the audit event (kinds and counts, who, where), which the usage
report counts.
"""

from __future__ import annotations

import codecs
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, cast

from app.services import access, audit
from app.services.access import Principal, Who, token_of
from app.storage.core import secret_scan
from app.storage.core.errors import SecretsRefused
from app.storage.core.models import ArtifactUpload
from app.storage.core.names import Scope
from app.storage.core.secret_policy import SecretPolicy, SecretsOverride
from app.storage.core.store_models import Memory
from app.storage.interface import StorageBackend, StoreBackend

# Artifacts masked as text: these media types, and any other whose first bytes decode as
# UTF-8 (an artifact sent as application/octet-stream is sniffed). Binary artifacts are
# stored as sent.
TEXT_TYPES = ("text/", "application/json", "application/x-ndjson", "application/xml")
TEXT_SUFFIXES = ("+json", "+xml", "yaml", "toml", "javascript", "x-sh", "x-diff", "x-patch")
SNIFF_BYTES = 8192
# A streamed artifact is masked piece by piece; a secret cut by a piece's end is found whole
# in the next one, which starts this many characters before it (longer than any secret the
# rules find but a PEM block, whose body the next piece still finds as a partial key).
OVERLAP = 4096
PIECE = 256 << 10


@dataclass
class Screen:
    """One write's screening: the project's policy, what was masked, what refused."""

    policy: SecretPolicy
    masked: Counter[str] = field(default_factory=Counter)
    refused: list[dict[str, Any]] = field(default_factory=list)
    _allowlist: secret_scan.Allowlist | None = None

    @staticmethod
    def of(storage: StorageBackend, principal: Principal) -> Screen:
        return Screen(storage.secret_policies.of(principal.scope))

    @property
    def active(self) -> bool:
        return self.policy.policy != "allow"

    @property
    def allowlist(self) -> secret_scan.Allowlist:
        if self._allowlist is None:
            self._allowlist = allowlist_of(self.policy)
        return self._allowlist

    def text(self, value: str, where: str) -> str:
        """``value`` as it may be stored (masked under ``mask``); under ``reject`` each secret
        is noted for :meth:`settle` and ``value`` comes back as it was."""
        if not self.active or not value:
            return value
        findings = secret_scan.scan(value, allowlist=self.allowlist)
        if not findings:
            return value
        if self.policy.policy == "reject":
            self.refused += [
                {"where": where, "kind": f.kind, "start": f.start, "end": f.end} for f in findings
            ]
            return value
        self.masked.update(f.kind for f in findings)
        return secret_scan.masked(value, findings)

    def json(self, value: Any, where: str) -> Any:
        """``value`` (JSON) with every string screened (:func:`map_strings`)."""
        return map_strings(value, where, self.text) if self.active else value

    def settle(self) -> None:
        """Refuse the write (SecretsRefused) when a secret was found under ``reject``."""
        if self.refused:
            raise SecretsRefused(self.refused)

    def record(
        self,
        storage: StorageBackend,
        principal: Principal,
        subject: str,
        *,
        store_id: str | None = None,
    ) -> None:
        """The audit event of what this write masked (none when it masked nothing)."""
        if self.masked:
            audit.event(
                storage,
                principal,
                "secrets",
                "masked",
                subject,
                {"kinds": dict(sorted(self.masked.items())), "count": self.masked.total()},
                store_id=store_id,
            )

    def summary(self) -> dict[str, int]:
        """What was masked, by kind (what an answer says; never a value)."""
        return dict(sorted(self.masked.items()))

    # -- artifacts ---------------------------------------------------------------------------
    def artifact(self, upload: ArtifactUpload, where: str) -> ArtifactUpload:
        """``upload`` with its bytes masked when it holds text (by its media type, or sniffed);
        binary uploads pass as they are."""
        if not self.active:
            return upload
        stream = _MaskingStream(self, upload.stream, upload.content_type, where)
        return ArtifactUpload(upload.name, upload.content_type, cast(IO[bytes], stream))


def allowlist_of(policy: SecretPolicy) -> secret_scan.Allowlist:
    """What the scanner lets through in a project of ``policy``."""
    return secret_scan.Allowlist(policy.allow_patterns, frozenset(policy.allow_fingerprints))


def map_strings(value: Any, where: str, change: Callable[[str, str], str]) -> Any:
    """``value`` (JSON: objects, lists, strings) with ``change(string, where)`` applied to
    every string, ``where`` naming it (``meta.notes[2]``); object keys are names, not
    values, and stay as they are."""
    if isinstance(value, str):
        return change(value, where)
    if isinstance(value, list):
        return [map_strings(v, f"{where}[{i}]", change) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: map_strings(v, f"{where}.{k}", change) for k, v in value.items()}
    return value


class ScreenedStores:
    """A store engine whose memory writes store their content and path as ``screen`` lets
    them (the memory tool's commands compute what they write, then write it through this):
    under ``reject`` a write that holds a secret raises SecretsRefused before it is made.
    Everything else is the engine's own."""

    def __init__(self, engine: StoreBackend, screen: Screen) -> None:
        self.engine = engine
        self.screen = screen

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def _screened(self, value: object, where: str) -> object:
        if not isinstance(value, str):
            return value  # the engine refuses what is no text
        screened = self.screen.text(value, where)
        self.screen.settle()
        return screened

    def create_memory(
        self, scope: Scope, store_id: str, *, path: object, content: object, **kw: Any
    ) -> Memory:
        return self.engine.create_memory(
            scope,
            store_id,
            path=self._screened(path, "path"),
            content=self._screened(content, "content"),
            **kw,
        )

    def update_memory(
        self,
        scope: Scope,
        store_id: str,
        memory_id: str,
        *,
        content: object = None,
        path: object = None,
        **kw: Any,
    ) -> Memory:
        return self.engine.update_memory(
            scope,
            store_id,
            memory_id,
            content=self._screened(content, "content"),
            path=self._screened(path, "path"),
            **kw,
        )


def refused(
    storage: StorageBackend, principal: Principal, exc: SecretsRefused, subject: str
) -> None:
    """The audit event of a write refused for its secrets (kinds and places, never values)."""
    kinds = Counter(item["kind"] for item in exc.findings)
    audit.event(
        storage,
        principal,
        "secrets",
        "refused",
        subject,
        {"kinds": dict(sorted(kinds.items())), "count": kinds.total()},
    )


def is_text_type(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media.startswith(TEXT_TYPES) or media.endswith(TEXT_SUFFIXES)


def looks_like_text(head: bytes) -> bool:
    """Whether the first bytes of an artifact read as UTF-8 text (a cut last character is
    allowed; a NUL byte is binary)."""
    if b"\x00" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


class _MaskingStream:
    """An artifact's body, masked as it is read when it is text: pieces of text are scanned
    with the :data:`OVERLAP` characters before them, and only what no later piece can still
    change is handed on. Binary bodies (and every body under ``allow``) pass through."""

    def __init__(self, screen: Screen, raw: IO[bytes], content_type: str | None, where: str):
        self.screen = screen
        self.raw = raw
        self.content_type = content_type
        self.where = where
        self._out = bytearray()
        self._pending = ""  # decoded text not yet handed on (may still change)
        self._offset = 0  # characters handed on before _pending
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._mode: str | None = None  # "text", "binary"; None until the first read
        self._done = False

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._out) < size):
            self._fill()
        if size < 0 or size >= len(self._out):
            data, self._out = bytes(self._out), bytearray()
        else:
            data, self._out = bytes(self._out[:size]), self._out[size:]
        return data

    def _fill(self) -> None:
        chunk = self.raw.read(PIECE)
        if self._mode is None:
            head = bytes(chunk[:SNIFF_BYTES])
            text = is_text_type(self.content_type) or looks_like_text(head)
            self._mode = "text" if text else "binary"
        if self._mode == "binary":
            self._out += chunk
            self._done = not chunk
            return
        held = self._decoder.getstate()[0]  # the bytes of a character cut by the last piece
        try:
            self._pending += self._decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError:
            # Not UTF-8 after all: every byte not handed on yet goes as it came, the text
            # waiting for more (valid UTF-8 encodes back to its own bytes), the cut character
            # the decoder held and this piece; only the text handed on before was screened.
            self._mode = "binary"
            self._out += self._pending.encode("utf-8") + held + chunk
            self._pending = ""
            self._done = not chunk
            return
        if not chunk:
            self._emit(len(self._pending))
            self._done = True
        elif len(self._pending) > OVERLAP:
            self._emit(len(self._pending) - OVERLAP)

    def _emit(self, upto: int) -> None:
        """Screen the pending text and hand on its first ``upto`` characters' worth: a
        secret that starts before ``upto`` is masked whole; the rest waits for more."""
        text = self._pending
        findings = secret_scan.scan(text, allowlist=self.screen.allowlist)
        cut = upto
        for f in findings:
            if f.start < upto < f.end:
                cut = f.end  # the secret goes out whole, masked
        done = [f for f in findings if f.end <= cut]
        if self.screen.policy.policy == "reject":
            found = [
                {
                    "where": self.where,
                    "kind": f.kind,
                    "start": self._offset + f.start,
                    "end": self._offset + f.end,
                }
                for f in done
            ]
            if found:
                # Raised from inside the storage call that reads this body: it takes back
                # what it staged, so nothing of the write is stored.
                self.screen.refused += found
                self.screen.settle()
            out = text[:cut]
        else:
            self.screen.masked.update(f.kind for f in done)
            out = secret_scan.masked(text[:cut], done)
        self._out += out.encode("utf-8")
        self._pending = text[cut:]
        self._offset += cut

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(PIECE):
            yield chunk


# -- the policy ------------------------------------------------------------------------------
def policy_of(storage: StorageBackend, tenant: str, project: str) -> SecretPolicy:
    """The policy ``tenant/project`` works under now, read from the document itself (what an
    answer shows; writes use the per-process copy, at most a second old). A private space
    works under its project's."""
    team = Scope(tenant, project).team
    return storage.limits().secrets().of(team.tenant, team.project, storage.secret_policies.default)


def set_policy(
    storage: StorageBackend, by: Who, tenant: str, project: str | None, change: SecretsOverride
) -> SecretsOverride:
    """Set what ``change`` gives of a project's secrets section (``project`` None: the
    tenant's, which its projects inherit): a project_admin of it and above (tenant_admin for
    a tenant's). InvalidLimit for a section that breaks core/secret_policy.py's rules."""
    access.require_set_secret_policy(by, tenant, project)
    return operator_set_policy(storage, tenant, project, change, actor=token_of(by).id)


def operator_set_policy(
    storage: StorageBackend,
    tenant: str,
    project: str | None,
    change: SecretsOverride,
    *,
    actor: str = "cli",
) -> SecretsOverride:
    """set_policy as the operator makes it (``flask secrets``), past the role rules. Every
    change is audited, with the policy and the size of each allowlist, never its entries."""
    done = storage.limits().set_secrets(tenant, project, change)
    detail: dict[str, Any] = {"policy": done.policy}
    if change.allow_patterns is not None or change.allow_fingerprints is not None:
        detail["allow_patterns"] = len(done.allow_patterns or ())
        detail["allow_fingerprints"] = len(done.allow_fingerprints or ())
    audit.record(
        storage,
        tenant,
        project,
        actor=actor,
        kind="secrets",
        action="policy_set",
        subject=project or tenant,
        detail=detail,
    )
    return done
