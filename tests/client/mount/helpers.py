"""A real gunicorn and a small client of the store API for the mount tests."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import requests

from tests.e2e.conftest import Server


def sha(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


class Remote:
    """The server side of a test: create stores, change memories, read them back."""

    def __init__(self, server: Server, token: str) -> None:
        self.url = server.url + "/v1/memory_stores"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        # An idle keep-alive connection would hold up gunicorn's graceful shutdown.
        self.session.close()

    def call(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        r = self.session.request(method, self.url + path, timeout=10, **kwargs)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        return r.json()

    def store(self, name: str) -> str:
        return str(self.call("POST", "", json={"name": name})["id"])

    def memories(self, store_id: str) -> dict[str, dict[str, Any]]:
        data = self.call("GET", f"/{store_id}/memories", params={"limit": 100})["data"]
        return {m["path"]: m for m in data if m["type"] == "memory"}

    def tree(self, store_id: str) -> dict[str, str]:
        out = {}
        for path, m in self.memories(store_id).items():
            out[path] = self.call("GET", f"/{store_id}/memories/{m['id']}")["content"]
        return out

    def put(self, store_id: str, path: str, content: str) -> dict[str, Any]:
        """Create or overwrite (unconditionally) the memory at ``path``."""
        found = self.memories(store_id).get(path)
        if found is None:
            return dict(
                self.call("POST", f"/{store_id}/memories", json={"path": path, "content": content})
            )
        return dict(
            self.call("POST", f"/{store_id}/memories/{found['id']}", json={"content": content})
        )

    def delete(self, store_id: str, path: str) -> None:
        found = self.memories(store_id)[path]
        self.call("DELETE", f"/{store_id}/memories/{found['id']}")

    def versions(self, store_id: str, **params: Any) -> list[dict[str, Any]]:
        return list(
            self.call("GET", f"/{store_id}/memory_versions", params={"limit": 100, **params})[
                "data"
            ]
        )


def local_tree(folder: Path) -> dict[str, str]:
    """Path -> text of every synced file under a mounted store folder."""
    return {
        "/" + p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".anthropic-memory-store" and not p.name.startswith(".~tmp-")
    }
