"""The client's copies of the server's rules agree with the server's, on many inputs.

The client must import nothing of the server, so it restates the few rules it applies
(project_memory_client.rules); these properties keep the two from drifting apart.
"""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st
from project_memory_client import rules as client
from project_memory_client.mount.sync import unholdable

from app.config import SETTINGS
from app.storage.core import store_rules as server, task_rules
from app.storage.core.errors import InvalidName
from app.storage.core.names import (
    ARTIFACT_NAME_PATTERN,
    STORE_ID_PATTERN,
    TMP_PREFIX,
    validate_artifact_name,
)

ULID_CHARS = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Near-misses of a store id: its letters, the ULID alphabet and the ones it leaves out.
ID_TEXT = st.text(alphabet=ULID_CHARS + "ILOUilou_memstore-0 \n", min_size=0, max_size=40)
STORE_IDS = st.builds(
    lambda body: "memstore_" + body, st.text(alphabet=ULID_CHARS + "IiLO", min_size=24, max_size=28)
)
NAMES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40
) | st.text(alphabet="Aa Zz09-_.~/\\\tÉé√ß", max_size=40)
PATH_SEGMENTS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=0, max_size=12
) | st.sampled_from([".", "..", "", TMP_PREFIX + "x", "a" * 256, "é" * 130])


def test_the_temp_prefix_and_the_store_id_pattern_are_the_servers() -> None:
    assert client.TMP_PREFIX == TMP_PREFIX
    assert client._STORE_ID_RE.pattern == STORE_ID_PATTERN


@settings(max_examples=500)
@given(ID_TEXT | STORE_IDS | st.none() | st.integers())
@example("memstore_01JABCDEFGHJKMNPQRSTVWXYZ0")
@example("memstore_01JABCDEFGHJKMNPQRSTVWXYZ0\n")
def test_is_store_id_agrees(value: object) -> None:
    assert client.is_store_id(value) == server.is_store_id(value)


@settings(max_examples=500)
@given(NAMES)
@example("User Preferences")
@example("  --Ünïcode--  ")
def test_slugify_agrees(name: str) -> None:
    assert client.slugify(name) == server.slugify(name)


@settings(max_examples=500)
@given(st.lists(PATH_SEGMENTS, min_size=1, max_size=6))
def test_every_path_the_server_accepts_is_one_a_mount_can_hold(segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    try:
        server.validate_memory_path(path)
    except InvalidName:
        return
    assert unholdable(path) is None, path


def test_the_artifact_limits_are_the_servers() -> None:
    assert client.ARTIFACT_NAME_PATTERN == ARTIFACT_NAME_PATTERN
    default_limit = SETTINGS["MAX_ARTIFACT_BYTES"][0]
    assert default_limit == client.MAX_ARTIFACT_BYTES
    assert client.MAX_ARTIFACTS_PER_WRITE == task_rules.MAX_ARTIFACTS_PER_WRITE
    assert client.MAX_CONTENT_TYPE_CHARS == task_rules.MAX_CONTENT_TYPE_CHARS


def _server_takes_name(name: str) -> bool:
    try:
        validate_artifact_name(name)
    except InvalidName:
        return False
    return True


ARTIFACT_NAMES = NAMES | st.text(alphabet="aZ09._-:/ é\n", max_size=12)


@settings(max_examples=500)
@given(ARTIFACT_NAMES)
@example(".")
@example("..")
@example("x.")
@example("a" * 129)
@example("run.log\n")
def test_artifact_names_agree(name: str) -> None:
    assert (client.artifact_name_fault(name) is None) == _server_takes_name(name)


def _server_takes_type(value: str) -> bool:
    try:
        task_rules.check_content_type(value)
    except InvalidName:
        return False
    return True


CONTENT_TYPES = st.text(alphabet='atx/+-.; ="\r\n\té:', max_size=20) | st.builds(
    lambda a, b, p: f"{a}/{b}{p}",
    st.text(alphabet="az09+-.!#", min_size=0, max_size=130),
    st.text(alphabet="az09+-.", min_size=0, max_size=8),
    st.sampled_from(["", "; charset=utf-8", ";x", ' ; y="z"', ";\n", "; é"]),
)


@settings(max_examples=500)
@given(CONTENT_TYPES)
@example("text/plain; " + "x" * 250)
def test_content_types_agree(value: str) -> None:
    assert client.is_content_type(value) == _server_takes_type(value)


def test_the_memory_limits_are_the_servers() -> None:
    assert client.MAX_MEMORY_CONTENT_BYTES == server.MAX_CONTENT_BYTES
    assert client.MAX_MEMORY_PATH_BYTES == server.MAX_PATH_BYTES
    assert client.MAX_MEMORY_PATH_SEGMENTS == server.MAX_PATH_SEGMENTS
    assert client.MAX_MEMORY_SEGMENT_BYTES == server.MAX_SEGMENT_BYTES


def _server_takes_path(path: str) -> bool:
    try:
        server.validate_memory_path(path)
    except InvalidName:
        return False
    return True


MEMORY_PATHS = st.lists(PATH_SEGMENTS, min_size=1, max_size=6).map(
    lambda segments: "/" + "/".join(segments)
) | st.text(alphabet="/a.é\u2028\u0301\u212b\x00~-", max_size=12)


@settings(max_examples=500)
@given(MEMORY_PATHS)
@example("/" + "/".join(["a"] * 21))
@example("/e\u0301")  # an e then a combining acute: NFC composes it
@example("/\u212b")  # ANGSTROM SIGN, which NFC replaces
@example("/notes" + "x" * 1024)
@example("relative/path")
def test_memory_paths_agree(path: str) -> None:
    assert (client.memory_path_fault(path) is None) == _server_takes_path(path), path
