"""What agents wrote becomes safe HTML: the Markdown sanitizer, meta, artifact kinds, diffs."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from app.console import render

HOSTILE_MARKDOWN = [
    "<script>window.pwned=1</script>",
    "<img src=x onerror=window.pwned=1>",
    '<a href="javascript:window.pwned=1">x</a>',
    "[x](javascript:window.pwned=1)",
    "[x](JaVaScRiPt:window.pwned=1)",
    "[x](&#106;avascript:window.pwned=1)",
    "[x](vbscript:msgbox(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![x](https://evil.example/track.png)",
    "![x](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)",
    '![x](/console/signout "a GET that must not happen by itself")',
    "[x](//evil.example/)",
    "[x](/\\evil.example/)",
    "<iframe src=https://evil.example></iframe>",
    "<svg onload=window.pwned=1>",
    '<div style="background:url(https://evil.example/)">x</div>',
    "[x]: javascript:window.pwned=1\n\n[x]",
    "<style>body{display:none}</style>",
    "<!-- <script>window.pwned=1</script> -->",
    "| a |\n|---|\n| <b onmouseover=window.pwned=1>x</b> |",
]


class _Tags(HTMLParser):
    """The elements and attributes a browser would build from the HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, dict(attrs)))


def tags_of(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html)
    return parser.found


@pytest.mark.parametrize("source", HOSTILE_MARKDOWN)
def test_hostile_markdown_yields_no_markup_that_acts(source: str) -> None:
    found = tags_of(str(render.markdown(source)))
    assert {tag for tag, _ in found} <= {"p", "a", "table", "thead", "tbody", "tr", "th", "td"}
    for tag, attrs in found:
        assert set(attrs) <= ({"href", "title", "rel"} if tag == "a" else set()), (tag, attrs)
        href = attrs.get("href")
        if href is not None:
            # Another site by an explicit scheme, or our own origin by a path; never a
            # script, data or protocol-relative URL.
            assert href.startswith(("https://", "http://", "/")), href
            assert not href.startswith("//"), href


def test_images_become_links_and_never_load() -> None:
    html = str(render.markdown("![the chart](https://example.com/chart.png)"))
    assert html == (
        '<p><a href="https://example.com/chart.png" rel="noopener noreferrer nofollow">'
        "[image: the chart]</a></p>\n"
    )


def test_ordinary_markdown_survives() -> None:
    html = str(
        render.markdown("## Done\n\n- **a** `b`\n- [c](https://example.com)\n\n```\nx<y\n```")
    )
    assert "<h2>Done</h2>" in html and "<strong>a</strong>" in html and "<code>b</code>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">c</a>' in html
    assert "<pre><code>x&lt;y\n</code></pre>" in html


def test_meta_rows_known_first_with_duration_then_the_rest() -> None:
    rows = render.meta_rows(
        {
            "zeta": [1, 2],
            "model": "opus",
            "ended_at": "2026-01-01T10:02:30Z",
            "started_at": 1767261600,  # epoch seconds: 2026-01-01T10:00:00Z
            "tokens": {"input": 10, "output": 5},
            "cost": 0.25,
            "exit_code": 0,
            "<b>": "x" * 5000,
        }
    )
    keys = [r.key for r in rows]
    assert keys == [
        "model",
        "exit_code",
        "started_at",
        "ended_at",
        "duration",
        "tokens",
        "cost",
        "<b>",
        "zeta",
    ]
    by_key = {r.key: r for r in rows}
    assert by_key["duration"].text == "2 min 30 s"
    assert by_key["tokens"].text == "input: 10, output: 5"
    assert by_key["zeta"].text == "[1, 2]" and not by_key["zeta"].known
    assert by_key["<b>"].text.endswith("(1000 more characters)")


def test_time_tags_carry_utc_and_survive_junk() -> None:
    tag = str(render.time_tag("2026-03-04T05:06:07.123456Z"))
    assert tag == (
        '<time datetime="2026-03-04T05:06:07Z" title="2026-03-04 05:06:07 UTC">'
        "2026-03-04 05:06 UTC</time>"
    )
    assert str(render.time_tag(1767261600000)).startswith('<time datetime="2026-01-01T10:00:00Z"')
    assert str(render.time_tag("<script>")) == "<span>&lt;script&gt;</span>"
    assert str(render.time_tag(True)) == "<span>true</span>"


@pytest.mark.parametrize(
    "content_type, kind",
    [
        ("image/png", "image"),
        ("IMAGE/JPEG; q=1", "image"),
        ("image/webp", "image"),
        ("image/gif", "image"),
        ("image/svg+xml", "download"),
        ("text/html; charset=utf-8", "download"),
        ("text/xml", "download"),
        ("application/pdf", "download"),
        ("application/octet-stream", "download"),
        ("application/xhtml+xml", "download"),
        ("text/plain; charset=utf-8", "text"),
        ("text/markdown", "text"),
        ("text/csv", "text"),
        ("application/json", "text"),
        ("application/vnd.api+json", "text"),
        ("application/x-ndjson", "text"),
    ],
)
def test_artifact_kinds(content_type: str, kind: str) -> None:
    assert render.artifact_kind(content_type) == kind


def test_text_preview_refuses_binary() -> None:
    assert render.text_preview(b"ok \xff") == "ok \ufffd"
    assert render.text_preview(b"PK\x03\x04\x00\x00") is None


def test_diff_lines_are_classified() -> None:
    lines = list(render.diff_lines("a\nb\n", "a\nc\n", "old", "new"))
    assert [(d.kind, d.text) for d in lines] == [
        ("file", "--- old"),
        ("file", "+++ new"),
        ("hunk", "@@ -1,2 +1,2 @@"),
        ("same", " a"),
        ("del", "-b"),
        ("add", "+c"),
    ]


def test_sizes() -> None:
    assert render.size(0) == "0 bytes"
    assert render.size(1023) == "1023 bytes"
    assert render.size(262144) == "256.0 KiB"
    assert render.size(50 * 1024 * 1024) == "50.0 MiB"
