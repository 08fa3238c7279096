"""A browser without a browser: requests plus the standard library's HTML parser, enough to follow the
links and submit the forms a newcomer would (hidden fields such as ``csrf_token`` included), over real HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin

import requests

__all__ = ["Browser", "Form", "Page"]


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    buttons: list[tuple[str | None, str | None, str]] = field(default_factory=list)  # (name, value, text)

    def text(self) -> str:
        return " ".join(label for _, _, label in self.buttons)


class _FormParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._current: Form | None = None
        self._button: list[str] | None = None
        self._button_attrs: dict[str, str | None] = {}
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self._current = Form(action=a.get("action") or "", method=(a.get("method") or "get").lower())
            self.forms.append(self._current)
            return
        if self._current is None:
            return
        if tag == "input":
            kind = (a.get("type") or "text").lower()
            name = a.get("name")
            if kind == "submit":
                self._current.buttons.append((name, a.get("value"), a.get("value") or ""))
            elif name and (kind not in {"checkbox", "radio"} or "checked" in a):
                self._current.fields[name] = a.get("value") or ""
        elif tag == "button":
            self._button, self._button_attrs = [], a
        elif tag == "textarea" and a.get("name"):
            self._textarea = a["name"]
            self._current.fields[self._textarea] = ""

    def handle_data(self, data: str) -> None:
        if self._button is not None:
            self._button.append(data)
        if self._textarea and self._current is not None:
            self._current.fields[self._textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None
        elif tag == "button" and self._button is not None and self._current is not None:
            kind = (self._button_attrs.get("type") or "submit").lower()
            if kind == "submit":
                text = " ".join("".join(self._button).split())
                self._current.buttons.append(
                    (self._button_attrs.get("name"), self._button_attrs.get("value"), text)
                )
            self._button = None
        elif tag == "textarea":
            self._textarea = None


@dataclass
class Page:
    url: str
    status: int
    text: str

    @property
    def forms(self) -> list[Form]:
        parser = _FormParser()
        parser.feed(self.text)
        return parser.forms

    def form(self, button_text: str) -> Form:
        """The form with a submit button whose text contains ``button_text``."""
        found = [f for f in self.forms if any(button_text in label for _, _, label in f.buttons)]
        assert found, f"no form with a {button_text!r} button on {self.url}: {[f.text() for f in self.forms]}"
        return found[0]


class Browser:
    """A cookie-keeping session that follows redirects and submits forms like a browser would."""

    def __init__(self, auth: tuple[str, str] | None = None) -> None:
        self.session = requests.Session()
        self.session.auth = auth

    def get(self, url: str) -> Page:
        response = self.session.get(url, timeout=30)
        return Page(response.url, response.status_code, response.text)

    def submit(self, page: Page, button_text: str, **values: str) -> Page:
        form = page.form(button_text)
        data = dict(form.fields)
        unknown = set(values) - set(data)
        assert not unknown, f"the form on {page.url} has no fields {sorted(unknown)}: {sorted(data)}"
        data.update(values)
        for name, value, label in form.buttons:
            if button_text in label and name:
                data[name] = value or ""
                break
        url = urljoin(page.url, form.action or page.url)
        if form.method == "post":
            response = self.session.post(url, data=data, timeout=60)
        else:
            response = self.session.get(url, params=data, timeout=60)
        return Page(response.url, response.status_code, response.text)
