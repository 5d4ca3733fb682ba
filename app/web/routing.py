"""URL rules whose URL builders are compiled once per process, not once per app.

werkzeug generates two Python functions for every rule as it joins a map (``Rule.compile``:
an AST per builder, passed to ``compile()``), and that was four fifths of ``create_app``:
each app of a process (a test, a CLI command that builds its own) compiled the same hundred
rules again. A builder's code depends only on the rule's parsed parts (``_trace``, which
already reflects the map's slash and host settings) and on whether it appends unknown
arguments as a query string; it reads everything else (converters, the map's options)
through the rule it is bound to, so one function serves every rule of the same text. Rules
with defaults fold those values into the code, so they are compiled as werkzeug does.
"""

from __future__ import annotations

from collections.abc import Callable

from werkzeug.routing import Rule as WerkzeugRule

# Keyed by the rule's text, its parsed parts and append_unknown; bounded by the rules the
# code defines. A race between two threads compiles one builder twice, which is harmless.
_builders: dict[tuple[str, tuple[tuple[bool, str], ...], bool], Callable[..., tuple[str, str]]] = {}


class Rule(WerkzeugRule):
    """A werkzeug rule that reuses the URL builders compiled for an equal rule."""

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        if self.defaults:
            return super()._compile_builder(append_unknown)
        key = (self.rule, tuple(self._trace), append_unknown)
        builder = _builders.get(key)
        if builder is None:
            builder = _builders[key] = super()._compile_builder(append_unknown)
        return builder
