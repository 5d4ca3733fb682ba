"""Each call of the Python client against a real gunicorn: results, conditions, errors, paging."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from project_memory_client import (
    ApiError,
    Client,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ServerUnreachable,
    TaskSummary,
    TurnRecord,
)

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e


def test_turns_put_get_and_their_conditions(pm: Client) -> None:
    first = pm.put_turn(
        "c-turns", 0, meta={"model": "claude", "exit_code": 0, "extra": [1]}, summary_md="## one"
    )
    assert isinstance(first, TurnRecord)
    assert (first.task_id, first.turn, first.summary_md) == ("c-turns", 0, "## one")
    assert first.meta == {"model": "claude", "exit_code": 0, "extra": [1]}
    assert first.etag and first.created_at and first.retain_until
    got = pm.get_turn("c-turns", 0)
    assert got == first
    # Unchanged since the ETag: None (a 304); after a write, the new record.
    assert pm.get_turn("c-turns", 0, if_none_match=first.etag) is None
    second = pm.put_turn("c-turns", 0, summary_md="## two", if_match=first.etag)
    assert second.etag != first.etag
    assert pm.get_turn("c-turns", 0, if_none_match=first.etag) == second
    with pytest.raises(PreconditionFailed) as stale:
        pm.put_turn("c-turns", 0, summary_md="## lost", if_match=first.etag)
    assert stale.value.status == 412 and stale.value.correlation_id
    with pytest.raises(PreconditionFailed):
        pm.put_turn("c-turns", 0, summary_md="## lost", if_none_match="*")
    assert pm.get_turn("c-turns", 0).summary_md == "## two"


def test_next_takes_the_number_after_the_latest_turn(pm: Client) -> None:
    assert pm.put_turn("c-next", "next", summary_md="a").turn == 0
    assert pm.put_turn("c-next", "next", summary_md="b").turn == 1
    pm.put_turn("c-next", 7, summary_md="gap")
    assert pm.put_turn("c-next", "next", summary_md="c").turn == 8
    assert [t.turn for t in pm.get_task("c-next").turns] == [0, 1, 7, 8]
    with pytest.raises(ValueError):
        pm.put_turn("c-next", "next", if_match='"t1"')


def test_artifacts_from_a_path_bytes_a_file_and_chunks_come_back_whole(
    pm: Client, tmp_path: Path
) -> None:
    pm.put_turn("c-art", 0)
    data = bytes(range(256)) * 5000  # 1.28 MB
    src = tmp_path / "run.log"
    src.write_bytes(data)
    seen: list[tuple[int, int | None]] = []
    record = pm.put_artifact("c-art", 0, "run.log", src, progress=lambda d, t: seen.append((d, t)))
    assert (record.name, record.size, record.task_id, record.turn) == (
        "run.log",
        len(data),
        "c-art",
        0,
    )
    assert record.content_type == "text/plain; charset=utf-8"  # a .log is text
    assert record.etag == f'"{hashlib.sha256(data).hexdigest()}"'
    assert seen[-1] == (len(data), len(data)) and len(seen) > 1
    pm.put_artifact("c-art", 0, "b.txt", b"bytes\n", content_type="text/plain")
    pm.put_artifact("c-art", 0, "f.bin", io.BytesIO(b"from a file object"))
    pm.put_artifact("c-art", 0, "g.bin", iter([b"chunk ", b"by ", b"chunk"]))

    out = tmp_path / "down" / "run.log"
    out.parent.mkdir()
    got: list[tuple[int, int | None]] = []
    info = pm.get_artifact("c-art", 0, "run.log", out, progress=lambda d, t: got.append((d, t)))
    assert out.read_bytes() == data
    assert (info.size, info.path, info.etag) == (len(data), str(out), record.etag)
    assert got[-1] == (len(data), len(data))
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.log"]  # no temp file left
    sink = io.BytesIO()
    text = pm.get_artifact("c-art", 0, "b.txt", sink)
    assert sink.getvalue() == b"bytes\n" and text.content_type.startswith("text/plain")
    for name, body in (("f.bin", b"from a file object"), ("g.bin", b"chunk by chunk")):
        sink = io.BytesIO()
        pm.get_artifact("c-art", 0, name, sink)
        assert sink.getvalue() == body
    assert {a.name for a in pm.get_turn("c-art", 0).artifacts} == {
        "run.log",
        "b.txt",
        "f.bin",
        "g.bin",
    }
    # Conditions hold for artifacts too; a failed download leaves the target as it was.
    with pytest.raises(PreconditionFailed):
        pm.put_artifact("c-art", 0, "b.txt", b"again", if_none_match="*")
    with pytest.raises(NotFound):
        pm.get_artifact("c-art", 0, "missing.bin", out)
    assert out.read_bytes() == data


def test_a_file_that_shrinks_while_it_uploads_stores_nothing(pm: Client, tmp_path: Path) -> None:
    pm.put_turn("c-shrink", 0)
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * (3 * 1024 * 1024))

    def shrink(done: int, total: int | None) -> None:
        if done == 256 * 1024:
            with open(src, "r+b") as fh:
                fh.truncate(300 * 1024)

    with pytest.raises(Exception, match="the file ended after"):
        pm.put_artifact("c-shrink", 0, "big.bin", src, progress=shrink)
    assert pm.get_turn("c-shrink", 0).artifacts == ()


def test_tasks_page_to_the_end_and_delete(pm_server: Server, tmp_path: Path) -> None:
    token = pm_server.token("writer", project="paging")
    with Client(pm_server.url, token) as pm:
        names = [f"p-{i:02d}" for i in range(7)]
        for name in names:
            pm.put_turn(name, 0, summary_md=f"summary of {name}")
        page = pm.list_tasks(limit=3)
        assert len(page.tasks) == 3 and page.total == 7 and page.next_cursor
        rest = pm.list_tasks(limit=3, cursor=page.next_cursor)
        assert {t.task_id for t in rest.tasks}.isdisjoint(t.task_id for t in page.tasks)
        every = list(pm.iter_tasks(page_size=3))
        assert all(isinstance(t, TaskSummary) for t in every)
        assert [t.task_id for t in every] == names[::-1]  # most recently updated first
        index = pm.get_task("p-03")
        assert (index.task_id, index.turn_count, index.latest_turn) == ("p-03", 1, 0)
        assert index.owner and index.turns[0].turn == 0
        pm.delete_task("p-03")
        with pytest.raises(NotFound):
            pm.get_task("p-03")
        assert len(list(pm.iter_tasks(page_size=2))) == 6
        # project.md: whole, or its first bytes cut at a line.
        digest = pm.get_digest()
        assert digest.startswith("# Project memory: acme/paging") and "## p-06" in digest
        assert "p-03" not in digest
        head = pm.get_digest(max_bytes=60)
        assert len(head.encode()) <= 60 and digest.startswith(head) and head.endswith("\n")
        # search: every hit, a page at a time.
        hits = list(pm.search("summary", page_size=2))
        assert sorted(h.task_id for h in hits if h.task_id) == sorted(set(names) - {"p-03"})
        first = pm.search_page("summary", limit=2)
        assert len(first.hits) == 2 and first.next_cursor and first.hits[0].kind == "turn"
        assert "\x02summary\x03" in first.hits[0].snippet
        usage = pm.usage()
        assert (usage.tenant, usage.project, usage.usage.tasks) == ("acme", "paging", 6)
        assert usage.quota.bytes is None and usage.disk is None
        me = pm.whoami()
        assert (me.role, me.tenant, me.project, me.token_project) == (
            "writer",
            "acme",
            "paging",
            "paging",
        )


def test_errors_carry_status_detail_and_correlation_id(pm_server: Server, pm: Client) -> None:
    with pytest.raises(NotFound) as missing:
        pm.get_turn("c-nope", 3)
    assert missing.value.status == 404
    assert missing.value.detail == "turn 3 of task c-nope not found"
    assert len(missing.value.correlation_id or "") == 26
    with pytest.raises(ApiError) as invalid:
        pm.put_turn("c-bad", 0, meta={"exit_code": "zero"})
    assert invalid.value.status == 422
    assert isinstance(invalid.value.detail, list)
    assert invalid.value.message.startswith("body.meta.exit_code: ")
    # A correlation id given to the client is the one the server logs and echoes.
    stranger = Client(pm_server.url, "pm_not-a-token", correlation_id="run-42")
    with stranger, pytest.raises(ApiError) as refused:
        stranger.whoami()
    assert (refused.value.status, refused.value.correlation_id) == (401, "run-42")
    assert "pm_not-a-token" not in str(refused.value)


@pytest.mark.parametrize("task_id", ["t/turns/0/artifacts/x", "..", ".", ""])
def test_an_id_that_would_change_the_url_is_refused_before_sending(
    pm: Client, task_id: str
) -> None:
    pm.put_turn("t", 0, summary_md="kept")
    with pytest.raises(InvalidArgument):
        pm.get_task(task_id)
    with pytest.raises(InvalidArgument):
        pm.put_turn(task_id, 0, summary_md="lost")
    with pytest.raises(InvalidArgument):
        pm.get_artifact("t", 0, f"{task_id}/x", io.BytesIO())
    assert pm.get_turn("t", 0).summary_md == "kept"


def test_a_server_that_cannot_be_reached_is_its_own_error(writer: str) -> None:
    pm = Client("http://127.0.0.1:9", writer, timeout=2)  # the discard port
    with pm, pytest.raises(ServerUnreachable) as down:
        pm.get_turn("t", 0)
    assert "127.0.0.1:9" in str(down.value) and writer not in str(down.value)


def test_delete_a_turn_and_an_artifact_with_their_etags(pm_server: Server) -> None:
    token = pm_server.token("writer", project="parts")
    with Client(pm_server.url, token) as pm:
        pm.put_turn("d-task", 0, summary_md="kept")
        turn1 = pm.put_turn("d-task", 1, summary_md="pasted a secret")
        stored = pm.put_artifact("d-task", 0, "env.txt", b"TOKEN=x")
        with pytest.raises(PreconditionFailed):
            pm.delete_artifact("d-task", 0, "env.txt", if_match='"0000"')
        pm.delete_artifact("d-task", 0, "env.txt", if_match=stored.etag)
        assert pm.get_turn("d-task", 0).artifacts == ()
        with pytest.raises(NotFound):
            pm.delete_artifact("d-task", 0, "env.txt")
        pm.delete_turn("d-task", 1, if_match=turn1.etag)
        assert [t.turn for t in pm.get_task("d-task").turns] == [0]
        assert list(pm.search("secret", mode="keyword")) == []
        # By meaning too, the deleted turn is gone (the kept one may be near).
        assert [h.turn for h in pm.search("secret")] in ([], [0])
        pm.delete_turn("d-task", 0)  # the last turn takes the task with it
        with pytest.raises(NotFound):
            pm.get_task("d-task")
