"""What a request may ask for: ids in the path and texts in the query string, checked before
any query runs, so that bad input is answered 404 (no such thing) or 400 (a malformed
request), never 500.

An id is ASCII digits up to the largest id the database's key columns hold (``int()`` alone
would take ``١`` or ``²``, overflow SQLite past 2**63 and PostgreSQL's ``integer`` past 2**31);
a text may not hold NUL (PostgreSQL refuses it in a parameter) nor be longer than
``MAX_TEXT``.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from starlette.requests import Request

MAX_ID = 2**63 - 1  # the largest integer SQLite stores (see tables.largest_id)
MAX_TEXT = 4096
_ID = re.compile(r"[0-9]{1,19}")


class BadInput(Exception):
    """A request the dashboard cannot answer: ``status`` is 404 or 400, ``message`` says why
    (shown on the page, or as ``{"error": message}`` by the JSON API)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found(what: str) -> BadInput:
    return BadInput(404, f"There is no {what} in this database.")


def path_id(request: Request, name: str, what: str, largest: int = MAX_ID) -> int:
    """The id in the path parameter ``name``; 404 when it is not one that can exist."""
    raw = str(request.path_params.get(name, ""))
    if not _ID.fullmatch(raw) or int(raw) > largest:
        raise not_found(f"{what} {raw[:64]}")
    return int(raw)


def query_text(request: Request, name: str, required: bool = False,
               choices: Collection[str] | None = None) -> str | None:
    """The text of query parameter ``name`` (the last one given); None when empty or absent,
    400 when required and missing, malformed, or not one of ``choices``."""
    value = request.query_params.get(name) or None
    if value is None:
        if required:
            raise BadInput(400, f"give ?{name}=...")
        return None
    if "\x00" in value or len(value) > MAX_TEXT:
        raise BadInput(400, f"?{name}: at most {MAX_TEXT} characters, no NUL")
    if choices is not None and value not in choices:
        raise BadInput(400, f"?{name}={value[:64]}: one of {', '.join(sorted(choices))}")
    return value


def query_id(request: Request, name: str, largest: int = MAX_ID) -> int | None:
    """An id given in the query string (a page's ``?before=``); 400 when not one."""
    value = query_text(request, name)
    if value is None:
        return None
    if not _ID.fullmatch(value) or int(value) > largest:
        raise BadInput(400, f"?{name}={value[:64]}: give a measurement id")
    return int(value)
