"""An artifact's body as the secret screen hands it on: masked when it is text, and byte for
byte what was sent when it holds no secret, whatever its bytes (binary, cut characters, text
that turns out not to be UTF-8) and however they are read."""

from __future__ import annotations

import io

from hypothesis import given, settings, strategies as st

from app.services.secrets import OVERLAP, Screen, _MaskingStream
from app.storage.core.secret_policy import SecretPolicy

TYPES = ("application/octet-stream", "text/plain", "application/x-w4-n16")


def _through(data: bytes, content_type: str, sizes: list[int]) -> bytes:
    stream = _MaskingStream(Screen(SecretPolicy()), io.BytesIO(data), content_type, "artifact")
    out, turn = b"", 0
    while chunk := stream.read(sizes[turn % len(sizes)] if sizes else -1):
        out += chunk
        turn += 1
    return out


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64).map(lambda t: t.encode("utf-8")),
        st.text(min_size=1, max_size=40).map(lambda t: t.encode("utf-8")[:-1]),  # a cut char
    ),
    content_type=st.sampled_from(TYPES),
    sizes=st.lists(st.integers(min_value=1, max_value=70), max_size=4),
)
def test_a_body_without_secrets_passes_unchanged(
    data: bytes, content_type: str, sizes: list[int]
) -> None:
    assert _through(data, content_type, sizes) == data


def test_a_single_byte_a_character_would_start_with_is_kept() -> None:
    # The decoder holds a lead byte waiting for the rest; at the end it is no text after all.
    for data in (b"\xe2", b"\xf0\x9f", b"ok\xe2", b"\x80"):
        for content_type in TYPES:
            assert _through(data, content_type, []) == data


def test_text_longer_than_the_overlap_and_cut_at_its_end_is_kept() -> None:
    data = ("é€😀a" * OVERLAP).encode("utf-8")[:-1]
    assert _through(data, "text/plain", [1000]) == data


def test_a_secret_in_text_is_masked_across_pieces() -> None:
    token = "ghp_" + "Ab3" * 12
    data = ("x" * (OVERLAP * 3) + f" {token} " + "y" * 100).encode()
    out = _through(data, "application/octet-stream", [4096])
    assert token.encode() not in out and b"[secret:github-token]" in out
