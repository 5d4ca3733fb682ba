"""A turn and its artifacts in one request: ``PUT .../turns/{turn}`` with a multipart body.

Beyond the seed: the seed's PUT takes JSON only, and that form stays exactly as it is. A
``multipart/form-data`` body carries the turn (a part named ``turn``, the seed's
PutTurnRequest as JSON, first) and any number of artifacts (parts named ``artifact``, the
artifact's name as the part's filename, its Content-Type kept); the turn and every artifact
commit together, as one write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import Tokens

pytestmark = pytest.mark.all_backends

BASE = "/sandbox/memory/v1"
BOUNDARY = "pm-test-boundary-7f3a"


def multipart(parts: list[tuple[str, str | None, str | None, bytes]], boundary: str = BOUNDARY):
    """A multipart/form-data body from (name, filename, content type, bytes) parts."""
    out = b""
    for name, filename, ctype, data in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if ctype is not None:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def turn_part(meta=None, summary: str = "s") -> tuple[str, None, str, bytes]:
    body = {"meta": meta if meta is not None else {"model": "m"}, "summary_md": summary}
    return ("turn", None, "application/json", json.dumps(body).encode())


def record(
    client: FlaskClient,
    tokens: Tokens,
    task: str,
    turn: int,
    parts: list,
    boundary: str = BOUNDARY,
    **headers: str,
):
    return client.put(
        f"{BASE}/tasks/{task}/turns/{turn}",
        data=multipart(parts, boundary),
        headers=tokens.headers(
            "writer", **{"Content-Type": f"multipart/form-data; boundary={boundary}", **headers}
        ),
    )


def test_a_turn_and_its_artifacts_in_one_request(client: FlaskClient, tokens: Tokens) -> None:
    log = bytes(range(256)) * 70
    put = record(
        client,
        tokens,
        "t",
        2,
        [
            turn_part({"model": "claude", "exit_code": 1}, "## Done"),
            ("artifact", "build.log", "text/plain", log),
            ("artifact", "out.bin", None, b"\x00\x01"),
        ],
    )
    assert put.status_code == 200, put.get_json()
    body = put.get_json()
    assert body["task_id"] == "t" and body["turn"] == 2
    assert body["meta"] == {"model": "claude", "exit_code": 1}
    assert body["summary_md"] == "## Done"
    assert [(a["name"], a["content_type"], a["size"]) for a in body["artifacts"]] == [
        ("build.log", "text/plain", len(log)),
        ("out.bin", "application/octet-stream", 2),
    ]
    got = client.get(f"{BASE}/tasks/t/turns/2", headers=tokens.headers("reader"))
    assert got.get_json() == body
    assert got.headers["ETag"] == put.headers["ETag"]
    one = client.get(
        f"{BASE}/tasks/t/turns/2/artifacts/build.log", headers=tokens.headers("reader")
    )
    assert one.data == log and one.headers["Content-Type"] == "text/plain"
    two = client.get(f"{BASE}/tasks/t/turns/2/artifacts/out.bin", headers=tokens.headers("reader"))
    assert two.data == b"\x00\x01"
    index = client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).get_json()
    assert index["turns"][0]["artifacts"] == ["build.log", "out.bin"]


def test_one_request_stores_what_the_seeds_two_requests_store(
    client: FlaskClient, tokens: Tokens
) -> None:
    meta = {"model": "m", "tokens": {"input": 1}}
    data = os.urandom(5000)
    seed = client.put(
        f"{BASE}/tasks/a/turns/0",
        json={"meta": meta, "summary_md": "x"},
        headers=tokens.headers("writer"),
    )
    assert seed.status_code == 200
    art = client.put(
        f"{BASE}/tasks/a/turns/0/artifacts/f.bin",
        data=data,
        headers=tokens.headers("writer", **{"Content-Type": "image/png"}),
    )
    assert art.status_code == 200
    one = record(
        client, tokens, "b", 0, [turn_part(meta, "x"), ("artifact", "f.bin", "image/png", data)]
    )
    assert one.status_code == 200

    def shape(task: str) -> tuple:
        turn = client.get(
            f"{BASE}/tasks/{task}/turns/0", headers=tokens.headers("reader")
        ).get_json()
        index = client.get(f"{BASE}/tasks/{task}", headers=tokens.headers("reader")).get_json()
        arts = [(a["name"], a["content_type"], a["size"]) for a in turn["artifacts"]]
        return (turn["meta"], turn["summary_md"], arts, [t["artifacts"] for t in index["turns"]])

    assert shape("a") == shape("b")
    listed = client.get(f"{BASE}/tasks", headers=tokens.headers("reader")).get_json()
    assert {t["task_id"] for t in listed["tasks"]} == {"a", "b"}
    digest = client.get(f"{BASE}/project.md", headers=tokens.headers("reader")).get_data(
        as_text=True
    )
    assert "## a" in digest and "## b" in digest


def test_named_artifacts_are_replaced_and_the_others_kept(
    client: FlaskClient, tokens: Tokens
) -> None:
    first = record(
        client, tokens, "t", 0,
        [turn_part(summary="v1"), ("artifact", "keep.txt", "text/plain", b"kept"),
         ("artifact", "swap.txt", "text/plain", b"old")],
    )  # fmt: skip
    assert first.status_code == 200
    second = record(
        client,
        tokens,
        "t",
        0,
        [turn_part(summary="v2"), ("artifact", "swap.txt", "text/plain", b"new!")],
    )
    assert second.status_code == 200
    assert second.get_json()["summary_md"] == "v2"
    sizes = {a["name"]: a["size"] for a in second.get_json()["artifacts"]}
    assert sizes == {"keep.txt": 4, "swap.txt": 4}
    for name, data in (("keep.txt", b"kept"), ("swap.txt", b"new!")):
        got = client.get(
            f"{BASE}/tasks/t/turns/0/artifacts/{name}", headers=tokens.headers("reader")
        )
        assert got.data == data


def test_a_turn_without_artifacts(client: FlaskClient, tokens: Tokens) -> None:
    put = record(client, tokens, "t", 0, [turn_part(summary="only")])
    assert put.status_code == 200
    assert put.get_json()["artifacts"] == [] and put.get_json()["summary_md"] == "only"


def test_preconditions_hold_for_the_whole_write(client: FlaskClient, tokens: Tokens) -> None:
    created = record(client, tokens, "t", 0, [turn_part(summary="v1")], **{"If-None-Match": "*"})
    assert created.status_code == 200
    again = record(
        client, tokens, "t", 0, [turn_part(summary="v2"), ("artifact", "a.txt", None, b"x")],
        **{"If-None-Match": "*"},
    )  # fmt: skip
    assert again.status_code == 412
    stale = record(
        client, tokens, "t", 0, [turn_part(summary="v3"), ("artifact", "a.txt", None, b"x")],
        **{"If-Match": '"not-the-etag"'},
    )  # fmt: skip
    assert stale.status_code == 412
    now = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()
    assert now["summary_md"] == "v1" and now["artifacts"] == []
    ok = record(
        client, tokens, "t", 0, [turn_part(summary="v4"), ("artifact", "a.txt", None, b"x")],
        **{"If-Match": created.headers["ETag"]},
    )  # fmt: skip
    assert ok.status_code == 200 and [a["name"] for a in ok.get_json()["artifacts"]] == ["a.txt"]


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    ("parts", "loc"),
    [
        ([("artifact", "a.txt", None, b"x")], ["body", "turn"]),
        ([], ["body", "turn"]),
        ([("artifact", "a.txt", None, b"x"), turn_part()], ["body", "turn"]),
        ([("turn", None, "application/json", b"{not json")], ["body", "turn"]),
        ([("turn", None, "application/json", b"[1, 2]")], ["body", "turn"]),
        ([("turn", None, "application/json", b'{"summary_md": 5}')], ["body", "turn", "summary_md"]),
        ([turn_part(), ("artifact", "../etc", None, b"x")], ["body", "artifact", "filename"]),
        ([turn_part(), ("artifact", "", None, b"x")], ["body", "artifact", "filename"]),
        ([turn_part(), ("artifact", None, None, b"x")], ["body", "artifact", "filename"]),
        ([turn_part(), ("artifact", "a", None, b"x"), ("artifact", "a", None, b"y")],
         ["body", "artifact", "filename"]),
        ([turn_part(), ("notes", None, None, b"x")], ["body", "notes"]),
        ([turn_part(), ("artifact", "a", "not a type", b"x")], ["body", "artifact", "Content-Type"]),
    ],
)  # fmt: skip
def test_a_bad_part_is_a_422_naming_it_and_nothing_is_written(
    client: FlaskClient, tokens: Tokens, parts: list, loc: list
) -> None:
    resp = record(client, tokens, "t", 0, parts)
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["detail"][0]["loc"] == loc
    gone = client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader"))
    assert gone.status_code == 404


@pytest.mark.shared_rule
@pytest.mark.parametrize(
    ("ctype", "body"),
    [
        ("multipart/form-data", multipart([turn_part()])),  # no boundary
        (f"multipart/form-data; boundary={BOUNDARY}", b"garbage without a boundary line"),
        (f"multipart/form-data; boundary={BOUNDARY}", multipart([turn_part()])[:-30]),  # cut off
        ("multipart/mixed; boundary=x", multipart([turn_part()], "x")),
    ],
)
def test_a_body_that_is_not_well_formed_multipart_is_a_422(
    client: FlaskClient, tokens: Tokens, ctype: str, body: bytes
) -> None:
    resp = client.put(
        f"{BASE}/tasks/t/turns/0",
        data=body,
        headers=tokens.headers("writer", **{"Content-Type": ctype}),
    )
    assert resp.status_code == 422, resp.get_json()
    assert resp.get_json()["detail"][0]["loc"][0] == "body"
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).status_code == 404


def test_too_many_artifacts_is_a_422(client: FlaskClient, tokens: Tokens) -> None:
    parts = [turn_part()] + [("artifact", f"a{i}", None, b"x") for i in range(33)]
    resp = record(client, tokens, "t", 0, parts)
    assert resp.status_code == 422
    assert "32" in resp.get_json()["detail"][0]["msg"]
    assert client.get(f"{BASE}/tasks/t", headers=tokens.headers("reader")).status_code == 404


def test_an_artifact_over_the_limit_is_a_413_and_nothing_is_written(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    app.extensions["storage"].tasks.max_artifact_bytes = 10
    ok = record(client, tokens, "t", 0, [turn_part(), ("artifact", "a", None, b"x" * 10)])
    assert ok.status_code == 200
    big = record(
        client, tokens, "t", 0,
        [turn_part(summary="v2"), ("artifact", "b", None, b"y" * 3), ("artifact", "c", None, b"x" * 11)],
    )  # fmt: skip
    assert big.status_code == 413
    assert "10 bytes" in big.get_json()["detail"]
    turn = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()
    assert turn["summary_md"] == "s" and [a["name"] for a in turn["artifacts"]] == ["a"]


def test_the_seeds_json_put_is_unchanged_by_the_multipart_form(
    client: FlaskClient, tokens: Tokens
) -> None:
    put = client.put(
        f"{BASE}/tasks/t/turns/0", json={"summary_md": "seed"}, headers=tokens.headers("writer")
    )
    assert put.status_code == 200 and put.get_json()["summary_md"] == "seed"
    text = client.put(
        f"{BASE}/tasks/t/turns/0",
        data=b"{bad",
        headers=tokens.headers("writer", **{"Content-Type": "application/json"}),
    )
    assert text.status_code == 422
    assert text.get_json()["detail"][0]["type"] == "json_invalid"


def test_the_openapi_document_marks_the_multipart_form_beyond_the_seed(
    client: FlaskClient,
) -> None:
    import yaml

    spec = yaml.safe_load(client.get("/sandbox/memory/v1/openapi.yaml").data)
    put = spec["paths"]["/sandbox/memory/v1/tasks/{task_id}/turns/{turn}"]["put"]
    content = put["requestBody"]["content"]
    assert "x-beyond-seed" not in content["application/json"]
    form = content["multipart/form-data"]
    assert form["x-beyond-seed"] is True
    assert set(form["schema"]["properties"]) == {"turn", "artifact"}


@pytest.mark.tree_only("reads the storage tree")
def test_nothing_is_left_behind_by_a_refused_record(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    app.extensions["storage"].tasks.max_artifact_bytes = 10
    assert record(client, tokens, "t", 0, [turn_part()]).status_code == 200
    refused = record(
        client,
        tokens,
        "t",
        0,
        [turn_part(), ("artifact", "a", None, b"x" * 3), ("artifact", "b", None, b"x" * 11)],
    )
    assert refused.status_code == 413
    clash = record(
        client,
        tokens,
        "t",
        0,
        [turn_part(), ("artifact", "a", None, b"x")],
        **{"If-None-Match": "*"},
    )
    assert clash.status_code == 412
    root = Path(app.config["STORAGE_ROOT"])
    left = [p for p in root.rglob("*") if p.name.startswith(".~tmp-")]
    assert left == []


def test_a_form_over_the_quota_is_a_507_and_nothing_is_written(
    app: Flask, client: FlaskClient, tokens: Tokens
) -> None:
    from app.storage.core.limits import QuotaOverride

    assert record(client, tokens, "t", 0, [turn_part({}, "")]).status_code == 200

    def used() -> int:
        got = client.get(f"{BASE}/usage", headers=tokens.headers("writer"))
        return int(got.get_json()["usage"]["bytes"])

    base = used()
    app.extensions["storage"].limits().set_quota("acme", "web", QuotaOverride(bytes=base + 100))
    two = [
        turn_part({}, ""),
        ("artifact", "a", None, b"x" * 60),
        ("artifact", "b", None, b"y" * 40),
    ]
    assert record(client, tokens, "t", 0, two).status_code == 200  # exactly at the quota
    assert used() == base + 100
    over = record(client, tokens, "t", 0, [turn_part({}, ""), ("artifact", "c", None, b"z")])
    assert over.status_code == 507, over.get_json()
    assert "over its storage quota" in over.get_json()["detail"]
    # A replacement that adds nothing still fits.
    same = record(client, tokens, "t", 0, [turn_part({}, ""), ("artifact", "a", None, b"w" * 60)])
    assert same.status_code == 200
    turn = client.get(f"{BASE}/tasks/t/turns/0", headers=tokens.headers("reader")).get_json()
    # The replaced one comes last, as a replacement by PUT artifact does.
    assert [a["name"] for a in turn["artifacts"]] == ["b", "a"] and used() == base + 100
