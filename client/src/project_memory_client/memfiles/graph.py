"""The reference MCP memory server's knowledge graph, as Markdown memories and back.

``@modelcontextprotocol/server-memory`` keeps its graph in one file of JSON lines::

    {"type":"entity","name":"Alice","entityType":"person","observations":["Likes tea"]}
    {"type":"relation","from":"Alice","to":"Acme","relationType":"works_at"}

and writes it whole on every change: every entity, then every relation, each as
``JSON.stringify`` writes it (no spaces; these keys, in this order), joined by ``\\n``, with no
newline at the end. :func:`serialize` writes the same bytes, so a file that server wrote
comes back byte for byte.

In a store the file is a folder of the same name, one memory per entity, named after it
(``/memory.json/Alice.md``; ``Alice-2.md`` for a second entity of the same name)::

    ---
    project-memory: "mcp-memory-entity"
    name: "Alice"
    entityType: "person"
    entity: 0
    relations: [0]
    ---
    # Alice

    Type: person

    ## Observations

    - Likes tea

    ## Relations

    - works_at → Acme

The front matter holds the entity (its values in JSON) and its place in the file: ``entity``
its position among the entities, ``relations`` the position among the relations of each
relation listed. A relation is listed in the memory of its ``from`` entity; relations whose
``from`` is no entity of the file go in ``_relations.md`` (``project-memory:
"mcp-memory-relations"``), each as ``- from → relationType → to``. A list item is the text
itself when it reads back unchanged (no line break or other control, no space at either end,
no leading ``"``, no `` → `` in a relation), else a JSON string. The title and the ``Type``
line are for people: export reads the front matter and the two lists only.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

ENTITY_KIND = "mcp-memory-entity"
RELATIONS_KIND = "mcp-memory-relations"
RELATIONS_FILE = "_relations.md"
ARROW = " → "
_MARK = "project-memory: "
_SLUG_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_SLUG_CHARS = 100


class GraphError(ValueError):
    """A memory that claims to be part of a graph and cannot be read back as one."""


@dataclass
class Entity:
    name: str
    entity_type: str
    observations: list[str]
    position: int | None = None
    relations: list[Relation] = field(default_factory=list)


@dataclass
class Relation:
    source: str  # "from"
    target: str  # "to"
    relation_type: str
    position: int | None = None


@dataclass
class Problem:
    line: int
    message: str


# -- the file --------------------------------------------------------------------------------
def js_json(value: Any) -> str:
    """``JSON.stringify(value)``: no spaces, non-ASCII as is, a lone surrogate as ``\\udxxx``."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def parse_file(text: str) -> tuple[list[Entity], list[Relation], list[Problem]]:
    """The graph of a memory file, read as the server reads it (blank lines skipped, fields
    it does not know dropped), with each line it could not use as a Problem."""
    entities: list[Entity] = []
    relations: list[Relation] = []
    problems: list[Problem] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(Problem(number, f"not JSON ({exc.msg})"))
            continue
        except RecursionError:
            problems.append(Problem(number, "not JSON this reader can take (nested too deep)"))
            continue
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "entity":
            name, entity_type, observations = (
                item.get("name"),
                item.get("entityType"),
                item.get("observations"),
            )
            if isinstance(name, str) and isinstance(entity_type, str) and _strings(observations):
                entities.append(Entity(name, entity_type, list(observations), len(entities)))
                continue
            problems.append(Problem(number, "an entity needs name, entityType and observations"))
        elif kind == "relation":
            source, target, relation_type = (
                item.get("from"),
                item.get("to"),
                item.get("relationType"),
            )
            if (
                isinstance(source, str)
                and isinstance(target, str)
                and isinstance(relation_type, str)
            ):
                relations.append(Relation(source, target, relation_type, len(relations)))
                continue
            problems.append(Problem(number, "a relation needs from, to and relationType"))
        else:
            problems.append(Problem(number, "neither an entity nor a relation"))
    return entities, relations, problems


def serialize(entities: list[Entity], relations: list[Relation]) -> str:
    """The file as the reference server writes it."""
    lines = [
        js_json(
            {
                "type": "entity",
                "name": e.name,
                "entityType": e.entity_type,
                "observations": e.observations,
            }
        )
        for e in entities
    ]
    lines += [
        js_json(
            {"type": "relation", "from": r.source, "to": r.target, "relationType": r.relation_type}
        )
        for r in relations
    ]
    return "\n".join(lines)


# -- the memories ----------------------------------------------------------------------------
def _plain(text: str, *, in_relation: bool) -> bool:
    """Whether ``text`` can be a list item as it is and read back the same."""
    return (
        text != ""
        and text == text.strip()
        and not text.startswith('"')
        and not (in_relation and ARROW.strip() in text)
        and not any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") for ch in text)
    )


def _item(text: str, *, in_relation: bool = False) -> str:
    return text if _plain(text, in_relation=in_relation) else js_json(text)


def _front(kind: str, pairs: list[tuple[str, Any]]) -> list[str]:
    lines = ["---", _MARK + js_json(kind)]
    lines += [f"{key}: {js_json(value)}" for key, value in pairs]
    return [*lines, "---"]


def entity_markdown(entity: Entity) -> str:
    lines = _front(
        ENTITY_KIND,
        [
            ("name", entity.name),
            ("entityType", entity.entity_type),
            ("entity", entity.position),
            ("relations", [r.position for r in entity.relations]),
        ],
    )
    lines += ["# " + _item(entity.name), "", "Type: " + _item(entity.entity_type), ""]
    lines += ["## Observations", ""]
    lines += ["- " + _item(o) for o in entity.observations]
    if entity.relations:
        lines += ["", "## Relations", ""]
        lines += [
            "- "
            + _item(r.relation_type, in_relation=True)
            + ARROW
            + _item(r.target, in_relation=True)
            for r in entity.relations
        ]
    return "\n".join(lines) + "\n"


def relations_markdown(relations: list[Relation]) -> str:
    lines = _front(RELATIONS_KIND, [("relations", [r.position for r in relations])])
    lines += ["# Relations from names that are no entity of this graph", "", "## Relations", ""]
    lines += [
        "- " + ARROW.join(_item(p, in_relation=True) for p in (r.source, r.relation_type, r.target))
        for r in relations
    ]
    return "\n".join(lines) + "\n"


def _slug(name: str) -> str:
    slug = _SLUG_RUN.sub("-", name).strip("-.").lstrip("_")[:MAX_SLUG_CHARS].strip("-.")
    return slug or "entity"


def memories(entities: list[Entity], relations: list[Relation]) -> dict[str, str]:
    """File name (in the graph's folder) -> Markdown, one per entity, plus ``_relations.md``
    for the relations whose ``from`` is no entity."""
    owner: dict[str, Entity] = {}
    for entity in entities:
        owner.setdefault(entity.name, entity)
        entity.relations = []
    orphans: list[Relation] = []
    for relation in relations:
        holder = owner.get(relation.source)
        if holder is None:
            orphans.append(relation)
        else:
            holder.relations.append(relation)
    out: dict[str, str] = {}
    taken: set[str] = {RELATIONS_FILE.lower()}
    for entity in entities:
        base = _slug(entity.name)
        name, n = f"{base}.md", 1
        # Case-insensitively distinct, so the folder can be checked out on any filesystem.
        while name.lower() in taken:
            n += 1
            name = f"{base}-{n}.md"
        taken.add(name.lower())
        out[name] = entity_markdown(entity)
    if orphans:
        out[RELATIONS_FILE] = relations_markdown(orphans)
    return out


def kind_of(content: str) -> str | None:
    """``ENTITY_KIND`` or ``RELATIONS_KIND`` for a graph memory, None for any other."""
    if not content.startswith("---\n" + _MARK):
        return None
    first = content[4 : content.find("\n", 4)]
    try:
        kind = json.loads(first[len(_MARK) :])
    except ValueError:
        return None
    return kind if kind in (ENTITY_KIND, RELATIONS_KIND) else None


def _read_item(text: str, parts: int) -> list[str]:
    """The ``parts`` strings of one list item: each plain or a JSON string, `` → `` between."""
    out: list[str] = []
    rest = text
    for i in range(parts):
        last = i == parts - 1
        if rest.startswith('"'):
            try:
                value, end = json.JSONDecoder().raw_decode(rest)
            except ValueError:
                raise GraphError(f"a bad JSON string in {text!r}") from None
            if not isinstance(value, str):
                raise GraphError(f"not a string: {text!r}")
            rest = rest[end:]
        else:
            cut = len(rest) if last else rest.find(ARROW)
            if cut < 0:
                raise GraphError(f"expected {parts} parts separated by '{ARROW.strip()}': {text!r}")
            value, rest = rest[:cut], rest[cut:]
        out.append(value)
        if last:
            if rest:
                raise GraphError(f"text after the item: {text!r}")
        elif rest.startswith(ARROW):
            rest = rest[len(ARROW) :]
        else:
            raise GraphError(f"expected {parts} parts separated by '{ARROW.strip()}': {text!r}")
    return out


def _parse(content: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    lines = content.split("\n")
    try:
        end = lines.index("---", 1)
    except ValueError:
        raise GraphError("the front matter does not end") from None
    front: dict[str, Any] = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(": ")
        if not sep:
            raise GraphError(f"not 'key: value' in the front matter: {line!r}")
        try:
            front[key] = json.loads(value)
        except ValueError:
            raise GraphError(f"{key}: not a JSON value") from None
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[end + 1 :]:
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None and line.strip():
            if not line.startswith("- "):
                raise GraphError(f"a line that is not a list item: {line!r}")
            current.append(line[2:])
    return front, sections


def _position(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _positions(front: dict[str, Any], count: int) -> list[int | None]:
    given = front.get("relations")
    given = given if isinstance(given, list) else []
    # Items added by hand have no position: they go after those that do.
    return [_position(given[i]) if i < len(given) else None for i in range(count)]


def read_memory(content: str) -> tuple[Entity | None, list[Relation]]:
    """The entity (None for ``_relations.md``) and the relations a graph memory holds."""
    kind = kind_of(content)
    front, sections = _parse(content)
    items = sections.get("Relations", [])
    positions = _positions(front, len(items))
    if kind == RELATIONS_KIND:
        relations = []
        for text, position in zip(items, positions, strict=True):
            source, relation_type, target = _read_item(text, 3)
            relations.append(Relation(source, target, relation_type, position))
        return None, relations
    name, entity_type = front.get("name"), front.get("entityType")
    if not isinstance(name, str) or not isinstance(entity_type, str):
        raise GraphError("the front matter needs name and entityType, as strings")
    observations = [_read_item(text, 1)[0] for text in sections.get("Observations", [])]
    relations = []
    for text, position in zip(items, positions, strict=True):
        relation_type, target = _read_item(text, 2)
        relations.append(Relation(name, target, relation_type, position))
    entity = Entity(name, entity_type, observations, _position(front.get("entity")), relations)
    return entity, relations


def _order(position: int | None, index: int) -> tuple[int, int, int]:
    return (1, 0, index) if position is None else (0, position, index)


def rebuild(contents: list[str]) -> str:
    """The file, from a graph's memories (in path order): entities by their ``entity``,
    relations by their position, items without one after the others, in path order."""
    entities: list[Entity] = []
    relations: list[Relation] = []
    for content in contents:
        entity, held = read_memory(content)
        if entity is not None:
            entities.append(entity)
        relations += held
    ordered = sorted(enumerate(entities), key=lambda p: _order(p[1].position, p[0]))
    ordered_relations = sorted(enumerate(relations), key=lambda p: _order(p[1].position, p[0]))
    return serialize([e for _, e in ordered], [r for _, r in ordered_relations])
