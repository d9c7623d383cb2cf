"""Pages of the registry's lists: `?limit=N&offset=K&descending=true` on `GET /participants`,
`/contracts`, `/tasks`, `/offers` and `/movements`, the number of rows in all in the
`X-Total-Count` header. Without `limit` a list is whole, as agents read it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Response
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from api.limits import MAX_ID

# The most rows one page holds.
MAX_LIMIT = 1000


class PageQuery:
    """Which page of a list the caller asks for."""

    def __init__(
        self,
        limit: int | None = Query(None, ge=1, le=MAX_LIMIT, description=f"At most this many rows (1 to {MAX_LIMIT}; default: every row)."),
        offset: int = Query(0, ge=0, le=MAX_ID, description="Rows to pass over first."),
        descending: bool = Query(False, description="Newest first: the list's order reversed (by id; participants by name)."),
    ) -> None:
        self.limit, self.offset, self.descending = limit, offset, descending
        self.total: int | None = None

    @classmethod
    def whole(cls) -> PageQuery:
        """The whole list, in its order."""
        return cls(limit=None, offset=0, descending=False)

    def rows(self, session: Session, query: Select, key) -> list:
        """The rows of `query` (not ordered) on this page, ordered by column `key`; keeps the total."""
        ordered = query.order_by(key.desc() if self.descending else key)
        if self.limit is None and not self.offset:
            found = list(session.scalars(ordered))
            self.total = len(found)
            return found
        self.total = session.scalar(select(func.count()).select_from(query.subquery()))
        return list(session.scalars(ordered.offset(self.offset).limit(self.limit)))

    def tell(self, response: Response) -> None:
        """The total in the `X-Total-Count` header."""
        if self.total is not None:
            response.headers["X-Total-Count"] = str(self.total)


Page = Annotated[PageQuery, Depends()]
