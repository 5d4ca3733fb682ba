"""A user's private space as a whole (core/names.py ``private_scope``): emptied at once, by
its owner or, for compliance, by a tenant_admin (access.py ``compliance_space``).

Each task and store goes through its own use case (tasks.delete_task, stores.delete_store),
so each removal is checked and audited as one made alone would be: a compliance delete's
events name whose space it was, in the project's log.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.services import access, stores, tasks
from app.services.access import Principal
from app.storage.core.errors import Forbidden
from app.storage.interface import StorageBackend

_PAGE = 100


@dataclass(frozen=True, slots=True)
class Emptied:
    tasks: int
    stores: int


def empty_space(storage: StorageBackend, principal: Principal) -> Emptied:
    """Delete every task and memory store of the private space ``principal`` acts in (its
    owner, a writer at least, or a tenant_admin's compliance delete); Forbidden in the
    team's project, which no request empties."""
    if principal.scope.owner is None:
        raise Forbidden("only a private space is emptied whole: ask with ?visibility=private")
    access.require_write(principal)
    if not (access.owns_space(principal) or access.is_compliance(principal)):
        raise Forbidden("a private space is emptied by its owner, or by a tenant_admin")
    # Every id first, page by page, then the deletes: a delete never moves a page read after it.
    task_ids: list[str] = []
    cursor: str | None = None
    while True:
        listed = storage.tasks.list_tasks(principal.scope, limit=_PAGE, cursor=cursor)
        task_ids += [t.task_id for t in listed.tasks]
        if (cursor := listed.next_cursor) is None:
            break
    store_ids: list[str] = []
    page: str | None = None
    while True:
        found = storage.stores.list_stores(
            principal.scope, limit=_PAGE, page=page, include_archived=True
        )
        store_ids += [s.id for s in found.data]
        if (page := found.next_page) is None:
            break
    for task_id in task_ids:
        tasks.delete_task(storage, principal, task_id)
    for store_id in store_ids:
        stores.delete_store(storage, principal, store_id)
    return Emptied(len(task_ids), len(store_ids))
