"""The documented exchanges: every example request and answer the gateway's developer documentation prints.

One JSON file per example (see README.md in this folder for the format and FACTS.md for what the pages
say). This module loads them and offers what the tests need to replay them: the request as printed
(obfuscated e-mail addresses restored), the same bytes in the spec's wire names, a documented token
swapped for one the emulator issued.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from flask_gateway.core.wire import OPERATOR, WireNames
from flask_gateway.core.wire.names import ROLES

FOLDER = Path(__file__).parent
DOCS_SITE = "https://developers.payjustnow.com/docs/"

#: How the documentation's pages print an e-mail address (a Cloudflare artefact): the files keep it in
#: ``body_text`` and give the address substituted in ``body``.
_OBFUSCATED = re.compile(r"\[email(?:\s|\xa0)protected\]")


@dataclass(frozen=True)
class Exchange:
    """One documented example."""

    name: str
    source: str
    operation: str
    method: str
    url: str
    #: The request body as the page prints it (whitespace included), e-mails restored; None: not printed.
    request_text: str | None
    request_body: Any
    #: The request headers the page prints (X-*, Content-Type).
    request_headers: dict[str, str]
    response_status: int | None
    response_body: Any
    #: Only part of the example could be recovered (see the file's notes).
    partial: bool
    notes: str

    @property
    def path(self) -> str:
        """The URL's path, e.g. ``/v2/create`` or ``/api/v1/merchant/refund`` (the install host's ``/v2``
        is ``/install/v2`` on the emulator)."""
        path = re.sub(r"^https?://[^/]+", "", self.url)
        return "/install/v2" if self.operation in ("v2.install", "v2.settings") else path

    def request_bytes(self, names: WireNames = OPERATOR, **replace: str) -> bytes:
        """The printed request in ``names``, with each documented value in ``replace`` swapped."""
        if self.request_text is None:
            raise ValueError(f"{self.name}: the documentation prints no request body")
        text = respell_text(self.request_text, names)
        for documented, ours in replace.items():
            text = text.replace(documented, ours)
        return text.encode("utf-8")


def respell(value: Any, names: WireNames) -> Any:
    """A documented (operator-named) JSON value with the operator-named keys spelled as ``names`` says."""
    if names is OPERATOR:
        return value
    renames = {OPERATOR.name(role): names.name(role) for role in ROLES}
    if isinstance(value, dict):
        return {renames.get(key, key): respell(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [respell(item, names) for item in value]
    return value


def respell_text(text: str, names: WireNames) -> str:
    """``respell`` on JSON text, keeping its whitespace (the bytes a client prints and signs)."""
    for role in ROLES:
        text = text.replace(f'"{OPERATOR.name(role)}"', f'"{names.name(role)}"')
    return text


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _emails(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_emails(item) for item in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_emails(item) for item in value)) if value else set()
    return {value} if isinstance(value, str) and "@" in value and " " not in value else set()


def _restore_emails(text: str | None, body: Any) -> str | None:
    """The printed text with the obfuscated address replaced by the one the parsed body gives."""
    if text is None or _OBFUSCATED.search(text) is None:
        return text
    emails = _emails(body)
    if len(emails) != 1:
        raise ValueError(f"cannot restore the obfuscated e-mail: the body gives {sorted(emails)}")
    return _OBFUSCATED.sub(emails.pop(), text)


@cache
def load(name: str) -> Exchange:
    data = json.loads((FOLDER / f"{name}.json").read_text(encoding="utf-8"))
    request = data.get("request") or {}
    response = data.get("response") or {}
    body = request.get("effective_body", request.get("body"))
    text = request.get("body_text")
    if "effective_body" in request:  # the page prints client options around the body: send the body
        text = json.dumps(body, indent=4)
    return Exchange(
        name=name,
        source=data["source"],
        operation=data["operation"],
        method=data["method"],
        url=data["url"],
        request_text=_restore_emails(text, body),
        request_body=body,
        request_headers=dict(request.get("headers") or {}),
        response_status=response.get("status"),
        response_body=response.get("body"),
        partial=bool(request.get("truncated") or response.get("truncated")),
        notes=data.get("notes", ""),
    )


def names() -> list[str]:
    """Every exchange in the folder, by file name."""
    return sorted(path.stem for path in FOLDER.glob("*.json"))
