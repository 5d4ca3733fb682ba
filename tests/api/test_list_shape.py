"""Hot views build their bodies by hand: pin them to their schemas."""

from __future__ import annotations

import json

from flask import Flask
from flask.testing import FlaskClient

from app.api.project_memory import task_list_out
from app.storage.core.names import Scope

API = "/sandbox/memory/v1"


def test_list_body_equals_the_schema_dump(app: Flask, client: FlaskClient, tokens) -> None:  # noqa: ANN001
    headers = tokens.headers("writer")
    for i in range(7):
        body = {"meta": {"model": "m"}, "summary_md": f"turn {i}"}
        for turn in range(i % 3 + 1):
            r = client.put(f"{API}/tasks/task-{i}/turns/{turn}", json=body, headers=headers)
            assert r.status_code == 200
    store = app.extensions["storage"].tasks
    cursor = None
    for limit in (3, 3, 3):
        url = f"{API}/tasks?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        r = client.get(url, headers=headers)
        assert r.status_code == 200
        page = store.list_tasks(Scope("acme", "web"), limit=limit, cursor=cursor)
        # Same keys, same order, same values as marshmallow's TaskList dump.
        assert list(json.loads(r.data).items()) == list(task_list_out.dump(page).items())
        assert [list(t) for t in json.loads(r.data)["tasks"]] == [
            list(t) for t in task_list_out.dump(page)["tasks"]
        ]
        cursor = page.next_cursor
    assert cursor is None


def test_turn_body_equals_the_schema_dump(app: Flask, client: FlaskClient, tokens) -> None:  # noqa: ANN001
    from app.api.project_memory import turn_out

    headers = tokens.headers("writer")
    meta = {"model": "m", "nested": {"a": [1, 2.5, None, True]}, "big": 2**70}
    r = client.put(
        f"{API}/tasks/t/turns/4", json={"meta": meta, "summary_md": "# s\n"}, headers=headers
    )
    assert r.status_code == 200
    for name in ("b.bin", "a.txt"):
        r = client.put(f"{API}/tasks/t/turns/4/artifacts/{name}", data=b"x", headers=headers)
        assert r.status_code in (200, 201)
    record = app.extensions["storage"].tasks.get_turn(Scope("acme", "web"), "t", 4)
    r = client.get(f"{API}/tasks/t/turns/4", headers=headers)
    assert r.status_code == 200
    body, dumped = json.loads(r.data), turn_out.dump(record)
    # Same keys, same order, same values as marshmallow's TurnRecord dump.
    assert list(body.items()) == list(dumped.items())
    assert [list(a) for a in body["artifacts"]] == [list(a) for a in dumped["artifacts"]]
    assert len(body["artifacts"]) == 2
