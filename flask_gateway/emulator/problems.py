"""Errors the emulator answers: a status and the JSON body ``{"message": ..., "errors": [...]}``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from flask_gateway.core.wire.names import OPERATOR, ROLES, WireNames

__all__ = ["ApiProblem", "ResponseDropped", "field_path", "validation_problem"]


class ResponseDropped(ConnectionResetError):
    """An injected fault dropped the answer where no socket could be reset (an in-process caller).

    It propagates out of the app on purpose: the test client sees an exception, as a real client sees a
    reset connection (``flask_gateway.core.wsgi.WSGIAdapter`` turns it into ``requests.ConnectionError``).
    """


class ApiProblem(Exception):
    """Raised anywhere in a request; the app turns it into its JSON answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        errors: Sequence[Mapping[str, str]] | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = list(errors) if errors else None
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"message": self.message}
        if self.errors:
            body["errors"] = self.errors
        body.update(self.extra)
        return body


def field_path(location: Iterable[int | str], prefix: str = "") -> str:
    """``("payjustnow", "orderItems", 0, "priceCents")`` -> ``payjustnow.orderItems[0].priceCents``."""
    path = prefix
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path or "body"


def validation_problem(error: ValidationError, names: WireNames = OPERATOR) -> ApiProblem:
    """400 naming every invalid field (never echoing the values: they may be secrets).

    A field that was sent is named as it was sent; a missing operator-named field as ``names`` spells it
    (pydantic names a missing field by its first accepted spelling, the operator's).
    """
    errors = [
        {"field": field_path(_spelled(detail["loc"], detail["type"], names)), "message": detail["msg"]}
        for detail in error.errors(include_input=False, include_url=False)
    ]
    return ApiProblem(400, "The request has missing or invalid fields.", errors=errors)


def _spelled(location: tuple[int | str, ...], kind: str, names: WireNames) -> tuple[int | str, ...]:
    if kind != "missing" or names is OPERATOR:
        return location
    respelled = {OPERATOR.name(role): names.name(role) for role in ROLES}
    return tuple(respelled.get(part, part) if isinstance(part, str) else part for part in location)
