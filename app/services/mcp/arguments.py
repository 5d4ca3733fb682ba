"""A tool call's arguments, checked one by one as the tool reads them.

Each check is the REST API's rule for the same value (the task-id pattern, strict integers
in range, the turn body's schema) and each fault a :class:`ToolFailure` whose message tells
the model what to change; names the tool's input schema does not list are refused whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.storage.core.errors import InvalidName
from app.storage.core.names import validate_id


class ToolFailure(Exception):
    """The call cannot be made as asked; the message tells the model why and what to do."""


class Arguments:
    """A tool's arguments, checked one by one against its input schema: the names it lists,
    each integer's bounds and default."""

    def __init__(self, tool: str, schema: Mapping[str, Any], arguments: object) -> None:
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolFailure(f"The arguments of {tool} must be a JSON object.")
        where = lone_surrogate_at(arguments)
        if where is not None:
            # A tool's answer often quotes its arguments (a path, a name, a search), and
            # storage keeps UTF-8: text no UTF-8 can carry is refused before either sees it.
            raise ToolFailure(
                f"{where[:200]} is not valid Unicode text: it holds an unpaired UTF-16"
                " surrogate escape (such as \\ud800). Send the text as UTF-8."
            )
        known: Mapping[str, Any] = schema["properties"]
        unknown = sorted(str(k) for k in arguments if k not in known)
        if unknown:
            raise ToolFailure(
                f"Unknown argument(s) for {tool}: {', '.join(unknown)}."
                f" It takes: {', '.join(known)}."
            )
        self.properties = known
        self.values: dict[str, Any] = arguments

    def text(self, name: str) -> str:
        value = self.optional_text(name)
        if value is None:
            raise ToolFailure(f"{name} is required.")
        return value

    def optional_text(self, name: str) -> str | None:
        value = self.values.get(name)
        if value is not None and not isinstance(value, str):
            raise ToolFailure(f"{name} must be a string.")
        return value

    def integer(self, name: str) -> int:
        """The integer given, else the schema's default."""
        value = self.optional_integer(name)
        if value is None:
            value = self.properties[name].get("default")
        if value is None:
            raise ToolFailure(f"{name} is required.")
        return value

    def optional_integer(self, name: str) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolFailure(f"{name} must be an integer.")
        bounds = self.properties[name]
        low, high = bounds.get("minimum"), bounds.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ToolFailure(f"{name} must be {_range(low, high)} (got {value}).")
        return value

    def task_id(self) -> str:
        value = self.text("task_id")
        try:
            return validate_id("task_id", value)
        except InvalidName as exc:
            raise ToolFailure(f"task_id: {exc.message} (got {value[:200]!r}).") from None


def _range(low: int | None, high: int | None) -> str:
    if low is None:
        return f"at most {high}"
    if high is None:
        return f"at least {low}"
    return f"between {low} and {high}"


def lone_surrogate_at(value: Any) -> str | None:
    """Where in ``value`` (parsed JSON) a string, a key or a value, holds a lone surrogate,
    as ``artifacts[0].content``; None when none does.

    JSON's ``"\\ud800"`` parses to one, and no UTF-8 carries it. Walked without recursion:
    the parser took any depth."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _is_utf8(item):
                return where or "the text"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and not _is_utf8(key):
                    return f"a key of {where}" if where else "an argument's name"
                stack.append((inner, f"{where}.{key}" if where else str(key)))
        elif isinstance(item, list):
            stack.extend((inner, f"{where}[{i}]") for i, inner in enumerate(item))
    return None


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def messages(found: Any, where: str = "") -> list[str]:
    """marshmallow's nested messages as ``field.sub: message`` lines."""
    if isinstance(found, Mapping):
        out: list[str] = []
        for key, value in found.items():
            out += messages(value, f"{where}.{key}" if where else str(key))
        return out
    if isinstance(found, list) and all(isinstance(m, str) for m in found):
        return [f"{where}: {m}" if where else m for m in found]
    return [f"{where}: {found}"]
