"""URL rules parsed and compiled once per process, not once per app.

werkzeug parses every rule as it joins a map (``Rule.compile``: the rule's text into the
parts the matcher walks, each converter's regex into them) and generates two Python
functions for it (``Rule._compile_builder``: an AST per builder, passed to ``compile()``).
That was most of ``create_app``: each app of a process (a test, a CLI command that builds
its own) parsed and compiled the same hundred rules again.

What parsing yields depends only on the rule's text, its host or subdomain, whether the
map merges slashes or matches hosts, and the converter classes the map has for the names
the rule uses: that is the key. The parts are shared (the matcher only reads them); the
converters are made anew for each rule, bound to its own map, as werkzeug makes them.

A builder's code depends only on the rule's parsed parts (``_trace``, which already
reflects the map's slash and host settings) and on whether it appends unknown arguments as
a query string; it reads everything else (converters, the map's options) through the rule
it is bound to, so one function serves every rule of the same text. Rules with defaults
fold those values into the code, so they are compiled as werkzeug does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from werkzeug.routing import BaseConverter, PathConverter, Rule as WerkzeugRule
from werkzeug.routing.rules import RulePart

# Both caches are bounded by the rules the code defines (and the maps' few settings). A
# race between two threads parses or compiles one rule twice, which is harmless.
_builders: dict[tuple[str, tuple[tuple[bool, str], ...], bool], Callable[..., tuple[str, str]]] = {}
_parsed: dict[tuple[Any, ...], _Parsed] = {}


class AnyNameConverter(PathConverter):
    """The rest of the path, whatever it holds, for a view whose validator names the rule.

    werkzeug's ``path`` stops at a line break (its ``.`` does not match one) and ``string``
    at a slash; either way a name the rules refuse got the router's 404 or 405 instead of
    the 422 that says which rule. Every route of one resource uses the same converter, so
    a name reaches the same view whichever method asks.
    """

    regex = r"[^/][\s\S]*?"


CONVERTERS: dict[str, type[BaseConverter]] = {"anyname": AnyNameConverter}


@dataclass(frozen=True)
class _Parsed:
    """What ``Rule.compile`` derived from a rule's text, but for the converter objects."""

    parts: tuple[RulePart, ...]
    trace: tuple[tuple[bool, str], ...]
    # (variable, converter name, positional args, keyword args), in the rule's order.
    converters: tuple[tuple[str, str, tuple[Any, ...], Mapping[str, Any]], ...]


class Rule(WerkzeugRule):
    """A werkzeug rule that reuses the parse and the URL builders of an equal rule."""

    _seen: list[tuple[str, str, tuple[Any, ...], Mapping[str, Any]]] | None = None

    def compile(self) -> None:
        assert self.map is not None, "rule not bound"
        key = (
            self.rule,
            self.host,
            self.subdomain,
            self.merge_slashes,
            self.map.host_matching,
            tuple(self.map.converters.items()),
        )
        parsed = _parsed.get(key)
        if parsed is None:
            self._seen = []
            try:
                super().compile()
                _parsed[key] = _Parsed(tuple(self._parts), tuple(self._trace), tuple(self._seen))
            finally:
                self._seen = None
            return
        self._parts = list(parsed.parts)
        self._trace = list(parsed.trace)
        self._converters = {}
        for variable, name, args, kwargs in parsed.converters:
            self._converters[variable] = self.get_converter(variable, name, args, kwargs)
            self.arguments.add(variable)
        self._build = self._compile_builder(False).__get__(self, None)
        self._build_unknown = self._compile_builder(True).__get__(self, None)

    def get_converter(
        self,
        variable_name: str,
        converter_name: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
    ) -> BaseConverter:
        if self._seen is not None:
            self._seen.append((variable_name, converter_name, args, kwargs))
        return super().get_converter(variable_name, converter_name, args, kwargs)

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        if self.defaults:
            return super()._compile_builder(append_unknown)
        key = (self.rule, tuple(self._trace), append_unknown)
        builder = _builders.get(key)
        if builder is None:
            builder = _builders[key] = super()._compile_builder(append_unknown)
        return builder
