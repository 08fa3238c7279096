"""Order references as people type them (in any case, when that names one order) and read them (whole)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup, escape
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, scoped_session

__all__ = ["AmbiguousReference", "keep_whole", "stored_reference"]


class AmbiguousReference(LookupError):
    """Several stored order references differ from the one given only by case."""

    def __init__(self, given: str, candidates: list[str]) -> None:
        self.given = given
        self.candidates = candidates
        super().__init__(
            f"{given!r} matches the order references {', '.join(map(repr, candidates))}, which differ only "
            "by case: give the reference exactly as the shop wrote it"
        )


def stored_reference(
    session: Session | scoped_session[Any],
    column: InstrumentedAttribute[Any],
    given: str,
    *where: ColumnElement[bool],
) -> str | None:
    """The order reference stored in ``column`` (rows limited by ``where``) that ``given`` names: itself when
    a row holds it exactly, else the one reference equal to it ignoring case (SQL ``lower()`` on both sides),
    else None. Raises :class:`AmbiguousReference` when several references differ from it only by case."""
    found = sorted(
        session.scalars(
            select(column).distinct().where(func.lower(column) == func.lower(given), *where)
        ).all()
    )
    if given in found or not found:
        return given if found else None
    if len(found) > 1:
        raise AmbiguousReference(given, found)
    return str(found[0])


def keep_whole(text: object, reference: str | None) -> Markup:
    """``text`` escaped for HTML, each ``reference`` in it kept whole on one line: wrapped in
    ``<span class="ref">``, which the pages' stylesheets make an inline block (a narrow screen moves it to
    the next line instead of breaking it at its hyphen). For raw payloads shown in ``<pre>``."""
    escaped = str(escape("" if text is None else text))
    if reference:
        kept = str(escape(reference))
        escaped = escaped.replace(kept, f'<span class="ref">{kept}</span>')
    return Markup(escaped)  # noqa: S704 - built from escaped parts only
