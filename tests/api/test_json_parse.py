"""A JSON body is parsed once by orjson when that gives what the standard library gives, and
by the standard library otherwise: the two paths never disagree on a value or on a refusal."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from app.api.common import _SLOW, _checked_loads, _strict_loads
from app.web.errors import RequestValidationError

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ; so do 0.0 and -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=8), values, max_size=6), ascii_only=st.booleans())
def test_the_fast_path_reads_what_the_standard_library_reads(
    doc: dict[str, Any], ascii_only: bool
) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    expected = json.loads(raw)
    fast = _strict_loads(raw)
    got = _checked_loads(raw, ["body"]) if fast is _SLOW else fast
    assert _same(got, expected)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 123456789012345678901234567890}',  # beyond 64 bits: a float to orjson
        b'{"a": -9223372036854775809}',
        b'{"a": 18446744073709551616}',
    ],
)
def test_long_integers_keep_their_value(raw: bytes) -> None:
    assert _strict_loads(raw) is _SLOW
    assert _same(_checked_loads(raw, ["body"]), json.loads(raw))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": Infinity}', "Infinity is not valid JSON"),
        (b'{"a": "\\ud800"}', "unpaired UTF-16 surrogates"),
        (b'\xef\xbb\xbf{"a": 1}', "BOM"),
        (b'{"a": "\xff"}', "JSON decode error"),
        (b'{"a": [1,]}', "JSON decode error"),
    ],
)
def test_what_orjson_refuses_gets_the_standard_librarys_error(raw: bytes, why: str) -> None:
    assert _strict_loads(raw) is _SLOW
    with pytest.raises(RequestValidationError) as caught:
        _checked_loads(raw, ["body"])
    assert why in caught.value.errors[0]["msg"]
