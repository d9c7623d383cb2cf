from __future__ import annotations

from fastapi import Response

from api import schemas
from api.deps import Caller, DbSession, Now
from api.pages import Page
from api.services import tasks as service
from api.routing import Router

router = Router(prefix="/tasks", tags=["tasks"])


@router.post("", status_code=201, response_model=schemas.TaskOut)
def register_task(body: schemas.TaskCreate, session: DbSession, caller: Caller):
    """Register a task whose origin and current host are the caller."""
    return service.to_out(service.register(session, caller, body))


@router.get("", response_model=list[schemas.TaskOut])
def list_tasks(session: DbSession, caller: Caller, page: Page, response: Response, host: schemas.NameQuery = None,
               origin: schemas.NameQuery = None, involving: schemas.NameQuery = None):
    """Tasks, optionally those hosted by or originating at one participant, or those that
    concern one (`involving`: it originates, hosts or keeps a replica of them); a page of them with `limit`."""
    tasks = service.list_tasks(session, host, origin, involving, page)
    page.tell(response)
    return [service.to_out(t) for t in tasks]


@router.get("/{task_id}", response_model=schemas.TaskOut)
def get_task(task_id: schemas.IdPath, session: DbSession, caller: Caller):
    """One task: its origin, current host, load and epoch."""
    return service.to_out(service.get(session, task_id))


@router.post("/{task_id}/retire", response_model=schemas.TaskOut)
def retire_task(task_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """The origin retires a task that handed its key groups over to the tasks a split or merge
    made, once its last window is out: no participant runs it again."""
    return service.to_out(service.retire(session, caller, task_id, now))
