"""A turn with its artifacts in one request (the multipart PUT, beyond the seed), from the
client and from the hooks' spool, against a real gunicorn; and the seed's requests for a
server that takes a turn only as JSON."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest
from project_memory_client import (
    ApiError,
    Client,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Upload,
)
from project_memory_client.agents.spool import Entry, Spool

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


class Watching(httpx.HTTPTransport):
    """The real transport, noting each request's method, path and media type. With
    ``json_only``, a form goes out labelled as JSON: what a server that knows no form sees
    of it (the body is read as JSON, and refused as a 422 at the body)."""

    def __init__(self, *, json_only: bool = False) -> None:
        super().__init__()
        self.json_only = json_only
        self.seen: list[tuple[str, str, str]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        kind = request.headers.get("Content-Type", "").split(";")[0]
        self.seen.append((request.method, request.url.path.split("/v1", 1)[1], kind))
        if self.json_only and kind == "multipart/form-data":
            request.headers["Content-Type"] = "application/json"
        return super().handle_request(request)

    def writes(self) -> list[tuple[str, str, str]]:
        return [s for s in self.seen if s[0] == "PUT"]


def _client(server: Server, token: str, transport: Watching) -> Client:
    return Client(server.url, token, transport=transport, max_retries=0)


def _bytes_of(pm: Client, task_id: str, turn: int, name: str) -> bytes:
    sink = io.BytesIO()
    pm.get_artifact(task_id, turn, name, sink)
    return sink.getvalue()


def test_a_turn_and_its_artifacts_go_in_one_request(
    pm_server: Server, writer: str, tmp_path: Path
) -> None:
    src = tmp_path / "run.log"
    src.write_bytes(bytes(range(256)) * 800)
    watch = Watching()
    seen: list[tuple[int, int | None]] = []
    with _client(pm_server, writer, watch) as pm:
        pm.put_turn("cf-one", 0, summary_md="first")
        pm.put_artifact("cf-one", 0, "kept.txt", b"kept\n")
        watch.seen.clear()
        record = pm.put_turn(
            "cf-one",
            0,
            meta={"model": "m"},
            summary_md="## with artifacts",
            artifacts=[
                Upload("run.log", src),
                Upload("notes.md", b"# notes\n", "text/markdown"),
                Upload("f.bin", io.BytesIO(b"from a file object")),
            ],
            progress=lambda done, total: seen.append((done, total)),
        )
        assert watch.writes() == [("PUT", "/tasks/cf-one/turns/0", "multipart/form-data")]
        assert len(watch.seen) == 1
        assert seen[-1][0] == seen[-1][1]  # the size was sent ahead and all of it went
        assert record.summary_md == "## with artifacts" and record.meta == {"model": "m"}
        kinds = {a.name: a.content_type for a in record.artifacts}
        assert sorted(kinds) == ["f.bin", "kept.txt", "notes.md", "run.log"]
        assert kinds["notes.md"].startswith("text/markdown")
        assert kinds["run.log"] == "text/plain; charset=utf-8"
        assert _bytes_of(pm, "cf-one", 0, "run.log") == src.read_bytes()
        assert _bytes_of(pm, "cf-one", 0, "kept.txt") == b"kept\n"
        assert pm.get_turn("cf-one", 0) == record

        # "next" with a form; If-None-Match holds for the form as for the seed's PUT.
        pm.put_turn("cf-one", 1, summary_md="taken")
        nxt = pm.put_turn("cf-one", "next", artifacts=[Upload("a.txt", io.BytesIO(b"a"))])
        assert nxt.turn == 2 and [a.name for a in nxt.artifacts] == ["a.txt"]
        with pytest.raises(PreconditionFailed):
            pm.put_turn("cf-one", 2, if_none_match="*", artifacts=[Upload("b.txt", b"b")])
        assert [a.name for a in pm.get_turn("cf-one", 2).artifacts] == ["a.txt"]

        # What would bend the part's header is refused before anything is sent.
        watch.seen.clear()
        for bad in (Upload('a"b', b"x"), Upload("a", b"x", "text/plain\r\nX-Evil: 1")):
            with pytest.raises(InvalidArgument):
                pm.put_turn("cf-one", 3, artifacts=[bad])
        assert watch.seen == []


def test_a_server_that_takes_a_turn_only_as_json_gets_the_seeds_requests(
    pm_server: Server, writer: str
) -> None:
    watch = Watching(json_only=True)
    with _client(pm_server, writer, watch) as pm:
        record = pm.put_turn(
            "cf-json",
            0,
            summary_md="old server",
            artifacts=[Upload("a.txt", b"alpha"), Upload("b.bin", b"beta")],
        )
        assert watch.writes() == [
            ("PUT", "/tasks/cf-json/turns/0", "multipart/form-data"),
            ("PUT", "/tasks/cf-json/turns/0", "application/json"),
            ("PUT", "/tasks/cf-json/turns/0/artifacts/a.txt", "text/plain"),
            ("PUT", "/tasks/cf-json/turns/0/artifacts/b.bin", "application/octet-stream"),
        ]
        assert record.summary_md == "old server"
        assert {a.name: a.size for a in record.artifacts} == {"a.txt": 5, "b.bin": 4}
        assert _bytes_of(pm, "cf-json", 0, "b.bin") == b"beta"
        # A stream that cannot be sent twice is not sent the second way: the refusal stands.
        with pytest.raises(ApiError) as refused:
            pm.put_turn("cf-json", 1, artifacts=[Upload("c.txt", iter([b"once"]))])
        assert refused.value.status == 422
        with pytest.raises(NotFound):
            pm.get_turn("cf-json", 1)


def test_the_spool_sends_a_turn_with_its_artifacts_in_one_request(
    pm_server: Server, writer: str, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "state")
    entry = Entry(
        record_id="rec-form-1",
        agent="claude",
        url=pm_server.url,
        tenant=None,
        project=None,
        task_id="cf-spool",
        meta={"model": "m"},
        summary_md="## spooled",
    )
    diff = b"--- a\n+++ b\n"
    spool.add(entry, {"diff.patch": (diff, "text/x-diff"), "t.jsonl": (b"{}\n", "text/plain")})
    watch = Watching()
    with _client(pm_server, writer, watch) as pm:
        outcome = spool.flush(pm, url=pm_server.url)
        assert (outcome.sent, outcome.kept, outcome.rejected) == (1, 0, 0), outcome.errors
        assert watch.writes() == [("PUT", "/tasks/cf-spool/turns/0", "multipart/form-data")]
        turn = pm.get_turn("cf-spool", 0)
        assert turn.meta["record_id"] == "rec-form-1"
        assert sorted(a.name for a in turn.artifacts) == ["diff.patch", "t.jsonl"]
        assert _bytes_of(pm, "cf-spool", 0, "diff.patch") == diff
    assert spool.count() == 0
