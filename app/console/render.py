"""Turning what agents wrote into safe HTML: Markdown, times, meta values, artifact kinds, diffs.

Every value an agent controls reaches a template either as text (Jinja escapes it) or through
:func:`markdown`, whose output passes an allowlist sanitizer (nh3, the Ammonia library) after
the Markdown renderer (markdown-it-py, raw HTML off). Images never load: the Markdown image
syntax becomes a plain link, so a summary cannot make the browser fetch anything. A search
snippet goes through :func:`snippet`: escaped whole, and only then its match markers (control
characters, untouched by escaping) become ``<mark>``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

from app.storage.core.query import MARK_END, MARK_START

MAX_VALUE_CHARS = 4000  # one meta value on a page; the rest is in the API's JSON
TEXT_PREVIEW_BYTES = 256 * 1024

RASTER_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
# Shown as escaped text inside our page. HTML, SVG, XML and anything unknown stay
# download-only: never rendered, nor offered as text that looks like a page.
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-sh",
        "application/x-python",
        "application/javascript",
        "application/sql",
    }
)
_NOT_TEXT = frozenset({"text/html", "text/xml", "text/xsl", "text/vtt"})


def _image_as_link(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    alt = self.renderInlineAsText(token.children or [], options, env) or "image"
    return f'<a href="{escapeHtml(src)}" class="md-image">[image: {escapeHtml(alt)}]</a>'


_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
_md.enable(["table", "strikethrough"])
_md.add_render_rule("image", _image_as_link)


def _relative_url(url: str) -> str | None:
    # Browsers read "//host", "/\host" and "\\host" as another origin: not relative at all.
    return None if url.startswith(("//", "/\\", "\\")) else url


_cleaner = nh3.Cleaner(
    tags={
        "a",
        "blockquote",
        "br",
        "code",
        "del",
        "em",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "li",
        "ol",
        "p",
        "pre",
        "s",
        "strong",
        "table",
        "tbody",
        "td",
        "th",
        "thead",
        "tr",
        "ul",
    },
    clean_content_tags={"script", "style"},
    attributes={"a": {"href", "title"}, "ol": {"start"}},
    url_schemes={"http", "https", "mailto"},
    link_rel="noopener noreferrer nofollow",
    url_relative=_relative_url,
    strip_comments=True,
)


def markdown(text: str) -> Markup:
    """Markdown as sanitized HTML."""
    return Markup(_cleaner.clean(_md.render(text)))  # noqa: S704 - sanitized just now


# -- times ---------------------------------------------------------------------------------
def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 string or epoch seconds (as meta carries them); None when neither."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            # Milliseconds since the epoch are common too; no run starts before 1973 in s.
            seconds = value / 1000 if abs(value) > 1e11 else value
            return datetime.fromtimestamp(seconds, UTC)
        if isinstance(value, str) and 10 <= len(value) <= 40:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


def time_tag(value: Any) -> Markup:
    """``<time>`` with the UTC value; console.js shows it in the viewer's zone."""
    moment = parse_time(value)
    if moment is None:
        return Markup("<span>{}</span>").format(short(value))
    utc = moment.astimezone(UTC)
    iso = utc.isoformat(timespec="seconds").replace("+00:00", "Z")
    return Markup('<time datetime="{}" title="{} UTC">{} UTC</time>').format(
        iso, utc.strftime("%Y-%m-%d %H:%M:%S"), utc.strftime("%Y-%m-%d %H:%M")
    )


def duration(seconds: float) -> str:
    if seconds < 0:
        return f"-{duration(-seconds)}"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def size(count: int | None) -> str:
    if count is None:
        return "–"
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} bytes"


# -- meta ----------------------------------------------------------------------------------
def short(value: Any, limit: int = MAX_VALUE_CHARS) -> str:
    """A meta value as text: strings as they are, anything else as compact JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) > limit:
        return f"{text[:limit]}… ({len(text) - limit} more characters)"
    return text


KNOWN_META = (
    "model",
    "agent_id",
    "commit",
    "exit_code",
    "started_at",
    "ended_at",
    "tokens",
    "cost",
    "job_id",
    "sandbox_id",
    "claude_session_id",
)
_TIME_KEYS = frozenset({"started_at", "ended_at"})


@dataclass(frozen=True, slots=True)
class MetaRow:
    key: str
    text: str
    time: Any = None  # a value to show with time_tag
    known: bool = True


def meta_rows(meta: dict[str, Any]) -> list[MetaRow]:
    """The meta of a turn, known keys first (with duration), then every other key."""
    rows: list[MetaRow] = []
    for key in KNOWN_META:
        if key not in meta or meta[key] is None:
            continue
        value = meta[key]
        if key in _TIME_KEYS and parse_time(value) is not None:
            rows.append(MetaRow(key, short(value), time=value))
        elif key in ("tokens", "cost") and isinstance(value, dict):
            parts = ", ".join(f"{k}: {short(v, 200)}" for k, v in value.items())
            rows.append(MetaRow(key, short(parts)))
        else:
            rows.append(MetaRow(key, short(value)))
        if key == "ended_at":
            start, end = parse_time(meta.get("started_at")), parse_time(value)
            if start is not None and end is not None:
                rows.append(MetaRow("duration", duration((end - start).total_seconds())))
    for key in sorted(k for k in meta if k not in KNOWN_META):
        rows.append(MetaRow(short(key, 200), short(meta[key]), known=False))
    return rows


# -- artifacts -----------------------------------------------------------------------------
def base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def artifact_kind(content_type: str) -> str:
    """'image' (previewed inline), 'text' (shown as escaped text) or 'download'."""
    kind = base_type(content_type)
    if kind in RASTER_TYPES:
        return "image"
    if kind in _TEXT_TYPES or kind.endswith("+json"):
        return "text"
    if kind.startswith("text/") and kind not in _NOT_TEXT:
        return "text"
    return "download"


def text_preview(head: bytes) -> str | None:
    """The start of an artifact as text, or None when it looks binary."""
    if b"\x00" in head:
        return None
    return head.decode("utf-8", errors="replace")


# -- diffs ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DiffLine:
    kind: str  # 'add', 'del', 'hunk', 'file' or 'same'
    text: str


def diff_lines(old: str, new: str, old_name: str, new_name: str) -> Iterator[DiffLine]:
    """A unified diff of two texts, line by line, with each line's kind for styling."""
    for line in difflib.unified_diff(
        old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=3
    ):
        if line.startswith(("---", "+++")):
            yield DiffLine("file", line)
        elif line.startswith("@@"):
            yield DiffLine("hunk", line)
        elif line.startswith("+"):
            yield DiffLine("add", line)
        elif line.startswith("-"):
            yield DiffLine("del", line)
        else:
            yield DiffLine("same", line)


# -- search snippets ------------------------------------------------------------------------
_MARKED = re.compile(f"{MARK_START}([^{MARK_START}{MARK_END}]*){MARK_END}")


def snippet(text: str) -> Markup:
    """A search snippet as HTML: escaped first, then each marked match a <mark>."""
    escaped = str(escape(text))
    marked = _MARKED.sub(r"<mark>\1</mark>", escaped)
    # Markers only ever come in pairs; anything left over is dropped, never shown.
    return Markup(marked.replace(MARK_START, "").replace(MARK_END, ""))  # noqa: S704 - escaped above
