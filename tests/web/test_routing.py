"""URL rules share their parse and their compiled URL builders across apps
(app/web/routing.py), and each app still matches and builds its own URLs: through its own
converters, defaults and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flask import Flask, url_for
from werkzeug.exceptions import NotFound
from werkzeug.routing import BaseConverter, BuildError, UnicodeConverter, ValidationError

from app import create_app
from app.web.routing import Rule


def _app(tmp_path: Path, name: str) -> Flask:
    return create_app(
        {
            "TESTING": True,
            "STORAGE_ROOT": str(tmp_path / name / "root"),
            "TOKENS_FILE": str(tmp_path / name / "tokens.json"),
        }
    )


def test_two_apps_share_builders_and_each_builds_its_own_urls(tmp_path: Path) -> None:
    first, second = _app(tmp_path, "a"), _app(tmp_path, "b")
    rules = {(r.endpoint, r.rule): r for r in first.url_map.iter_rules()}
    others = {(r.endpoint, r.rule): r for r in second.url_map.iter_rules()}
    assert rules.keys() == others.keys() and len(rules) > 50
    for key, rule in rules.items():
        if rule.endpoint == "static":
            continue  # added by Flask() itself, before create_app sets the rule class
        other = others[key]
        assert isinstance(rule, Rule) and rule.map is first.url_map
        assert other.map is second.url_map
        for mine, theirs in (
            (rule._build, other._build),
            (rule._build_unknown, other._build_unknown),
        ):
            assert mine.__func__ is theirs.__func__  # type: ignore[attr-defined]
            assert mine.__self__ is rule and theirs.__self__ is other  # type: ignore[attr-defined]
        assert rule._parts == other._parts and rule._parts is not other._parts
        assert all(a is b for a, b in zip(rule._parts, other._parts, strict=True))
        assert rule._converters.keys() == other._converters.keys() == rule.arguments
        for name, converter in rule._converters.items():
            assert converter.map is first.url_map
            assert other._converters[name].map is second.url_map
    for application in (first, second):
        with application.test_request_context():
            url = url_for(
                "console.memory", tenant="a b", project="web", store_id="s", memory_id="m 1"
            )
            assert url == "/console/p/a%20b/web/stores/s/memories/m%201"
            assert url_for("console.signin", next="/console/x") == (
                "/console/signin?next=/console/x"
            )
        application.extensions["traffic"].close()
        application.extensions["storage"].close()


class _Even(UnicodeConverter):
    def to_url(self, value: Any) -> str:
        if int(value) % 2:
            raise ValidationError()
        return str(value)


def test_a_shared_builder_converts_through_its_own_rule() -> None:
    """The same rule text with another converter, or beside a rule with defaults: each
    rule builds with what it has."""
    plain, even, with_default = Flask("plain"), Flask("even"), Flask("with_default")
    for application in (plain, even, with_default):
        application.url_rule_class = Rule
    plain.url_map.converters["n"] = UnicodeConverter
    even.url_map.converters["n"] = _Even
    plain.add_url_rule("/x/<n:v>", "x", lambda v: "")
    even.add_url_rule("/x/<n:v>", "x", lambda v: "")

    def view(v: str) -> str:
        return v

    with_default.add_url_rule("/x/", "x", view, defaults={"v": "d"})
    with_default.add_url_rule("/x/<v>", "x", view)
    with plain.test_request_context():
        assert url_for("x", v="3") == "/x/3"
    with even.test_request_context():
        assert url_for("x", v="4") == "/x/4"
        with pytest.raises(BuildError):
            url_for("x", v="3")
    with with_default.test_request_context():
        assert url_for("x", v="d") == "/x/"
        assert url_for("x", v="e") == "/x/e"


def test_a_shared_parse_follows_each_maps_converters_and_slashes() -> None:
    """The same rule text on maps with other converters or another slash rule is parsed
    for each: it matches what its own map says."""
    plain, even, merging = Flask("plain"), Flask("even"), Flask("merging")
    for application in (plain, even, merging):
        application.url_rule_class = Rule
        application.url_map.merge_slashes = application is merging
    plain.url_map.converters["n"] = UnicodeConverter
    even.url_map.converters["n"] = _Digits
    merging.url_map.converters["n"] = UnicodeConverter
    for application in (plain, even, merging):
        application.add_url_rule("/y//<n:v>", "y", lambda v: v)
    assert plain.url_map.bind("h").match("/y//abc") == ("y", {"v": "abc"})
    assert even.url_map.bind("h").match("/y//123") == ("y", {"v": "123"})
    with pytest.raises(NotFound):
        even.url_map.bind("h").match("/y//abc")
    assert merging.url_map.bind("h").match("/y/abc") == ("y", {"v": "abc"})
    with pytest.raises(NotFound):
        plain.url_map.bind("h").match("/y/abc")


class _Digits(BaseConverter):
    regex = "[0-9]+"
