"""The few memory-stores calls the sync client makes, over ``httpx``.

Plain HTTP rather than the ``anthropic`` SDK: the sync rules are written in HTTP statuses
(404 re-create, 409 the store wins, 400/413 refused), the SDK is an optional extra, and a
plain client keeps retries and timeouts ours (every call is bounded by the caller's
deadline, which the final sync on exit needs).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import httpx

from .. import __version__
from ..settings import Settings
from .errors import ApiError, TransportError

__all__ = ["ApiError", "StoreClient", "TransportError"]

DEFAULT_TIMEOUT = 10.0


class StoreClient:
    """One server, one credential; ``calls`` counts requests by kind (for logs and tests).

    ``tenant`` and ``project`` name the scope for a token that covers several (an admin or
    tenant_admin token); without them the server uses the token's own.
    """

    def __init__(
        self,
        server: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        tenant: str | None = None,
        project: str | None = None,
        agent: str = "project-memory-mount",
    ) -> None:
        self.base = server.rstrip("/") + "/v1/memory_stores"
        self.timeout = timeout
        settings = Settings(url=server, token=token, tenant=tenant, project=project)
        # Each call sets its own timeout, from the caller's deadline.
        self.session = settings.http(f"{agent}/{__version__}", timeout=timeout)
        self.calls: Counter[str] = Counter()

    def close(self) -> None:
        self.session.close()

    def _call(
        self,
        kind: str,
        method: str,
        url: str,
        *,
        deadline: float | None,
        params: dict[str, Any] | None = None,
        json: Any = None,
    ) -> Any:
        timeout = self.timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise TransportError("out of time")
        self.calls[kind] += 1
        try:
            response = self.session.request(
                method, self.base + url, params=params, json=json, timeout=timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise TransportError(f"{method} {url}: {exc or type(exc).__name__}") from None
        if response.status_code >= 500:
            raise TransportError(f"{method} {url}: HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            error = error if isinstance(error, dict) else {}
            raise ApiError(
                response.status_code,
                str(error.get("type") or "error"),
                str(error.get("message") or response.reason_phrase),
            )
        if body is None:
            raise TransportError(f"{method} {url}: the answer is not JSON")
        return body

    # -- calls -------------------------------------------------------------------------
    def list_stores(self, *, deadline: float | None = None) -> list[dict[str, Any]]:
        """Every store that is not archived, newest first, 100 a page."""
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": 100}
        while True:
            page = self._call("list_stores", "GET", "", deadline=deadline, params=params)
            items.extend(page["data"])
            if not page.get("next_page"):
                return items
            params = {**params, "page": page["next_page"]}

    def create_store(self, name: str, *, deadline: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "create_store", "POST", "", deadline=deadline, json={"name": name}
        )
        return result

    def get_store(self, store_id: str, *, deadline: float | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._call("get_store", "GET", f"/{store_id}", deadline=deadline)
        return result

    def list_memories(
        self, store_id: str, *, full: bool = False, deadline: float | None = None
    ) -> list[dict[str, Any]]:
        """Every memory: ``view=basic`` (no content) 100 a page, or ``view=full`` 20 a page."""
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = (
            {"view": "full", "limit": 20} if full else {"view": "basic", "limit": 100}
        )
        kind = "list_full" if full else "list"
        while True:
            page = self._call(
                kind, "GET", f"/{store_id}/memories", deadline=deadline, params=params
            )
            items.extend(m for m in page["data"] if m.get("type") == "memory")
            if not page.get("next_page"):
                return items
            params = {**params, "page": page["next_page"]}

    def get_memory(
        self, store_id: str, memory_id: str, *, deadline: float | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "retrieve",
            "GET",
            f"/{store_id}/memories/{memory_id}",
            deadline=deadline,
            params={"view": "full"},
        )
        return result

    def create_memory(
        self, store_id: str, path: str, content: str, *, deadline: float | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "create",
            "POST",
            f"/{store_id}/memories",
            deadline=deadline,
            json={"path": path, "content": content},
        )
        return result

    def update_memory(
        self,
        store_id: str,
        memory_id: str,
        content: str,
        expected_sha256: str,
        *,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "update",
            "POST",
            f"/{store_id}/memories/{memory_id}",
            deadline=deadline,
            json={
                "content": content,
                "precondition": {"type": "content_sha256", "content_sha256": expected_sha256},
            },
        )
        return result

    def delete_memory(
        self,
        store_id: str,
        memory_id: str,
        expected_sha256: str,
        *,
        deadline: float | None = None,
    ) -> None:
        self._call(
            "delete",
            "DELETE",
            f"/{store_id}/memories/{memory_id}",
            deadline=deadline,
            params={"expected_content_sha256": expected_sha256},
        )

    def list_versions(
        self, store_id: str, memory_id: str, *, deadline: float | None = None
    ) -> list[dict[str, Any]]:
        """The memory's newest versions (one page of 20, newest first), with their content."""
        page = self._call(
            "versions",
            "GET",
            f"/{store_id}/memory_versions",
            deadline=deadline,
            params={"memory_id": memory_id, "view": "full", "limit": 20},
        )
        return [v for v in page["data"] if isinstance(v, dict)]
