"""The client's copies of the server's rules agree with the server's, on many inputs.

The client must import nothing of the server, so it restates the few rules it applies
(project_memory_client.rules); these properties keep the two from drifting apart.
"""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st
from project_memory_client import rules as client
from project_memory_client.mount.sync import unholdable

from app.storage.core import store_rules as server
from app.storage.core.errors import InvalidName
from app.storage.core.names import STORE_ID_PATTERN, TMP_PREFIX

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
