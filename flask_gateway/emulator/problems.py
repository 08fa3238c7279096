"""Errors the emulator answers: a status and the JSON body ``{"message": ..., "errors": [...]}``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

__all__ = ["ApiProblem", "ResponseDropped", "field_path", "validation_problem"]


class ResponseDropped(Exception):
    """An injected fault dropped the answer where no socket could be reset (the in-process test client).

    It propagates out of the app on purpose: the test client sees an exception, as a real client sees a
    reset connection.
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
    """``("service", "orderItems", 0, "priceCents")`` -> ``service.orderItems[0].priceCents``."""
    path = prefix
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path or "body"


def validation_problem(error: ValidationError, prefix: str = "") -> ApiProblem:
    """400 naming every invalid field (never echoing the values: they may be secrets)."""
    errors = [
        {"field": field_path(detail["loc"], prefix), "message": detail["msg"]}
        for detail in error.errors(include_input=False, include_url=False)
    ]
    return ApiProblem(400, "The request has missing or invalid fields.", errors=errors)
