"""What the reliability tests do over real HTTP: shoppers, the owner, the gateway's API and callbacks.

Shoppers and the owner are ``requests`` sessions filling the shop's HTML forms (CSRF tokens parsed from the
pages); the consumer's choice is made on the emulator's hosted payment page (its Pay and Cancel forms). The
emulator's control API and both databases are read to compare the two sides.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import requests

from flask_gateway.core.wire import CheckoutStatusPayload, dumps
from flask_gateway.signing import sign
from tests.conftest import fetch_all
from tests.reliability.conftest import OWNER_PASSWORD, ROOT, SHOP_APP, Stack

T = TypeVar("T")

_CSRF = re.compile(r'<input[^>]*name="csrf_token"[^>]*>')
_VALUE = re.compile(r'value="([^"]*)"')
_ATTEMPT = re.compile(r'<input[^>]*name="attempt"[^>]*value="([^"]*)"')
_FORM = re.compile(r'<form[^>]*action="([^"]*)"[^>]*>(.*?)</form>', re.S)
PAYMENT_PAGE = re.compile(r"/api/v2/app/checkout/([^/?#]+)$")
CUSTOMER = {
    "first_name": "Thandi",
    "last_name": "Nkosi",
    "email": "thandi@example.com",
    "phone": "082 123 4567",
    "billing_line1": "12 Long Street",
    "billing_line2": "",
    "billing_city": "Cape Town",
    "billing_province": "Western Cape",
    "billing_postal_code": "8001",
    "shipping_same": "y",
}


class Recorder:
    """Every HTTP answer the test got (thread safe): none may be a 5xx."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.statuses: list[tuple[int, str, str]] = []

    def hook(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.statuses.append((response.status_code, response.request.method or "", response.url))

    def server_errors(self) -> list[tuple[int, str, str]]:
        """5xx answers, but the shop's 502 "we couldn't reach the payment provider" on its checkout."""
        with self._lock:
            return [
                entry
                for entry in self.statuses
                if entry[0] >= 500
                and not (entry[0] == 502 and entry[1] == "POST" and entry[2].endswith("/checkout"))
            ]


def new_session(recorder: Recorder | None = None) -> requests.Session:
    session = requests.Session()
    if recorder is not None:
        session.hooks["response"].append(recorder.hook)
    return session


def csrf_token(page: str) -> str:
    tag = _CSRF.search(page)
    assert tag is not None, "no CSRF token in the page"
    value = _VALUE.search(tag[0])
    assert value is not None
    return html.unescape(value[1])


def forms(page: str) -> dict[str, str]:
    """``{action path: csrf token}`` of the page's POST forms."""
    found = {}
    for action, body in _FORM.findall(page):
        tag = _CSRF.search(body)
        value = _VALUE.search(tag[0]) if tag else None
        found[html.unescape(action)] = html.unescape(value[1]) if value else ""
    return found


def checkout_fields(page: str) -> dict[str, str]:
    """The checkout form of ``page`` filled in: its CSRF token and attempt id, and the customer's details."""
    attempt = _ATTEMPT.search(page)
    assert attempt is not None, "no attempt field on the checkout page"
    return {"csrf_token": csrf_token(page), "attempt": html.unescape(attempt[1]), **CUSTOMER}


# --- the shopper -----------------------------------------------------------------------------------------


@dataclass
class Shopper:
    """One browser: its own cookies (the shop's session and the emulator's)."""

    shop_url: str
    recorder: Recorder | None = None
    session: requests.Session = field(init=False)

    def __post_init__(self) -> None:
        self.session = new_session(self.recorder)

    def fresh_connections(self) -> Shopper:
        """The same browser (its cookies) with no connection open yet: a racer sends on a connection of
        its own, never on a kept-alive one the server may be closing at that very moment."""
        self.session = clone(self.session, self.recorder)
        return self

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self.session.get(urljoin(self.shop_url + "/", url), timeout=30, **kwargs)

    def post(self, url: str, data: dict[str, str], **kwargs: Any) -> requests.Response:
        return self.session.post(urljoin(self.shop_url + "/", url), data=data, timeout=30, **kwargs)

    def add_to_cart(self, slug: str, quantity: int = 1) -> None:
        page = self.get(f"/products/{slug}")
        assert page.status_code == 200, page.status_code
        answer = self.post(
            f"/cart/add/{slug}", {"csrf_token": csrf_token(page.text), "quantity": str(quantity)}
        )
        assert answer.status_code == 200, answer.status_code  # redirected to the cart

    def checkout_form(self) -> dict[str, str]:
        """The filled checkout form (with its CSRF token), ready to POST to /checkout."""
        page = self.get("/checkout")
        assert page.status_code == 200, page.status_code
        return checkout_fields(page.text)

    def submit_checkout(self, form: dict[str, str]) -> requests.Response:
        """POST the checkout form, not following the 303 to the payment page."""
        return self.post("/checkout", form, allow_redirects=False)

    def pay_or_cancel(
        self, payment_url: str, action: str, *, follow: bool = True, page: requests.Response | None = None
    ) -> requests.Response:
        """On the emulator's payment page, submit its Pay or Cancel form (``action``: pay or cancel).

        ``follow``: come back to the shop (the return page asks the gateway, then the order page);
        otherwise the shopper closes the browser after the gateway's answer. ``page``: the payment page as
        the shopper opened it earlier (the click submits that page's form, as a browser does, whatever
        happened to the checkout since); without it the page is loaded now.
        """
        page = page or self.session.get(payment_url, timeout=30)
        assert page.status_code == 200, (page.status_code, payment_url)
        path = urlsplit(payment_url).path
        target = f"{path}/{action}"
        token = forms(page.text).get(target)
        assert token is not None, f"no {action} form on {payment_url}"
        root = payment_url[: -len(path)]
        return self.session.post(
            root + target, data={"csrf_token": token}, timeout=30, allow_redirects=follow
        )


def place_order(
    stack: Stack, products: dict[str, int], recorder: Recorder | None = None
) -> tuple[Shopper, str]:
    """A shopper who filled a cart and submitted the checkout: (shopper, paymentUrl)."""
    shopper = Shopper(stack.shop.url, recorder)
    for slug, quantity in products.items():
        shopper.add_to_cart(slug, quantity)
    answer = shopper.submit_checkout(shopper.checkout_form())
    assert answer.status_code == 303, (answer.status_code, answer.text[:500])
    return shopper, answer.headers["Location"]


def token_of(payment_url: str) -> str:
    found = PAYMENT_PAGE.search(payment_url)
    assert found is not None, payment_url
    return found[1]


# --- the owner --------------------------------------------------------------------------------------------


def owner_session(stack: Stack, recorder: Recorder | None = None) -> requests.Session:
    session = new_session(recorder)
    page = session.get(stack.shop.url + "/admin/login", timeout=30)
    answer = session.post(
        stack.shop.url + "/admin/login",
        data={"csrf_token": csrf_token(page.text), "password": OWNER_PASSWORD, "next": ""},
        timeout=30,
    )
    assert answer.status_code == 200 and "/admin/login" not in answer.url, answer.url
    return session


def clone(session: requests.Session, recorder: Recorder | None = None) -> requests.Session:
    """Another connection pool with the same cookies: the same browser, a separate connection."""
    twin = new_session(recorder)
    twin.cookies.update(session.cookies)
    return twin


# --- the gateway ------------------------------------------------------------------------------------------


def control_get(stack: Stack, path: str, **params: str) -> Any:
    response = requests.get(f"{stack.emulator.url}/_emulator/{path}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def control_post(stack: Stack, path: str, body: dict[str, Any] | None = None) -> Any:
    response = requests.post(f"{stack.emulator.url}/_emulator/{path}", json=body or {}, timeout=60)
    response.raise_for_status()
    return response.json()


def add_fault(stack: Stack, **rule: Any) -> None:
    control_post(stack, "faults", rule)


def signing_key(stack: Stack, account: str) -> str:
    """The account's signing key as the emulator stores it (the shop holds the same one, encrypted)."""
    rows = fetch_all(
        stack.emulator_db,
        "SELECT signing_key FROM emulator_accounts WHERE merchant_account_id = :account",
        account=account,
    )
    assert rows and rows[0][0], f"account {account} is not installed"
    return str(rows[0][0])


def shop_account(stack: Stack) -> str:
    rows = fetch_all(stack.shop_db, "SELECT merchant_account_id FROM gateway_installations")
    assert len(rows) == 1
    return str(rows[0][0])


def callback_request(stack: Stack, token: str) -> tuple[bytes, dict[str, str]]:
    """The status callback the emulator would send now for ``token``: the body (the 16-key status payload,
    serialised like ``checkouts.status_payload(...).to_json()``) and its signed headers."""
    detail = control_get(stack, f"checkouts/{token}")
    body = CheckoutStatusPayload.model_validate(detail["status"]).to_json()
    account = detail["merchantAccountId"]
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": account,
        "X-Signature": sign(body, signing_key(stack, account)),
    }
    return body, headers


@dataclass
class DirectAccount:
    """A merchant account of its own on the emulator, called directly (signed v2 requests)."""

    stack: Stack
    account: str
    key: str

    def post(
        self, path: str, body: dict[str, Any], session: requests.Session | None = None
    ) -> requests.Response:
        raw = dumps(body)
        headers = {
            "Content-Type": "application/json",
            "X-Merchant-Account-ID": self.account,
            "X-Signature": sign(raw, self.key),
        }
        return (session or requests).post(
            f"{self.stack.emulator.url}{path}", data=raw, headers=headers, timeout=60
        )

    def create_body(self, request_id: str, total_cents: int = 100_000) -> dict[str, Any]:
        return {
            "requestId": request_id,
            "checkoutTotalCents": total_cents,
            "payjustnow": {
                "merchantOrderReference": f"direct-{request_id}",
                "orderAmountCents": total_cents,
                "orderItems": [
                    {
                        "name": "Kettle",
                        "sku": "K-1",
                        "quantity": 1,
                        "priceCents": total_cents,
                        "imageUrl": "https://shop.example/k.png",
                        "pageUrl": "https://shop.example/k",
                        "searchTerms": ["kettle"],
                    }
                ],
                "confirmRedirectUrl": "https://shop.example/return/ok",
                "cancelRedirectUrl": "https://shop.example/return/cancel",
            },
        }


def direct_account(stack: Stack) -> DirectAccount:
    """Issue and install a fresh account whose callbacks go nowhere (a closed port): API tests only."""
    account = f"direct-{uuid.uuid4().hex[:10]}"
    api_key = f"key-{uuid.uuid4().hex}"
    control_post(
        stack,
        "accounts",
        {"merchantAccountId": account, "merchantAccountApiKey": api_key, "cancelCallbacks": False},
    )
    answer = requests.post(
        f"{stack.emulator.url}/install/v2",
        json={
            "merchantAccountId": account,
            "merchantAccountApiKey": api_key,
            "checkoutStatusCallbackUrl": "http://127.0.0.1:9/callback",
            "minimumCheckoutAmountCents": 100,
            "maximumCheckoutAmountCents": 10_000_000,
        },
        timeout=30,
    )
    assert answer.status_code in (200, 201), answer.text
    return DirectAccount(stack, account, answer.json()["secretSigningKey"])


# --- the shop's CLI ---------------------------------------------------------------------------------------


def gateway_command(stack: Stack, process: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``flask gateway <args>`` in a process of its own, on the server's app (cron runs the server's code;
    ``RELIABILITY_PROCESS`` names it in the failing receiver's rows)."""
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", SHOP_APP, "gateway", *args],
        env={**os.environ, **stack.shop_env, "RELIABILITY_PROCESS": process},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# --- running things together ------------------------------------------------------------------------------


def together(count: int, action: Callable[[int], T], *, timeout: float = 120) -> list[T | BaseException]:
    """Run ``action(i)`` for i in range(count) in ``count`` threads released at once by a barrier.

    Returns each result, or the exception it raised, in order.
    """
    barrier = threading.Barrier(count)
    results: list[T | BaseException] = [RuntimeError("did not run")] * count

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[index] = action(index)
        except BaseException as exc:  # reported to the caller, who asserts on it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"together-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return results


# --- what the logs and databases say --------------------------------------------------------------------------


_ACCESS = re.compile(r"^ACCESS (\d{3}) (\S+) (\S+)", re.M)


def traceback_spans(lines: list[str]) -> Iterator[tuple[int, int]]:
    """Where each traceback of a log's ``lines`` is: the index of its ``Traceback`` line, and of the first
    unindented line after its frames (the exception's line; ``len(lines)`` when the log ends first)."""
    for number, line in enumerate(lines):
        if "Traceback" not in line:
            continue
        end = number + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        yield number, end


def tracebacks(text: str, expected: str | None = None) -> tuple[int, list[str]]:
    """The tracebacks in a log: how many end in the ``expected`` exception (its name in the exception's
    line, the first unindented line after the frames), and the others (``line N: <exception line>``)."""
    lines = text.splitlines()
    seen, problems = 0, []
    for number, end in traceback_spans(lines):
        line = lines[number]
        raised = lines[end] if end < len(lines) else ""
        if (
            expected is not None
            and line.startswith("Traceback (most recent call last):")
            and expected in raised
        ):
            seen += 1
        else:
            problems.append(f"line {number + 1}: {line} ... {raised}")
    return seen, problems


def log_problems(
    stack: Stack, injected_500: Mapping[str, int] | None = None, *, expected_exception: str | None = None
) -> list[str]:
    """Answers no request may get, and tracebacks, in the servers' logs.

    Any 500, from either server, but for the emulator's injected ones: ``injected_500`` maps
    ``"METHOD /path"`` to how many 500 fault answers the test had the emulator give there. The emulator's
    other 5xx are injected faults too; the shop answers 502 only from ``POST /checkout`` ("we couldn't
    reach the payment provider") and 503 only from ``POST /gateway/callback`` (its getstatus confirmation
    met an injected gateway fault: the gateway retries), and any other 5xx of the shop counts. A traceback
    of ``expected_exception`` (a failure the test injected into a receiver, logged by the outbox) is not a
    problem; any other traceback is.
    """
    problems = []
    allowed = Counter(injected_500 or {})
    for name, text in stack.logs().items():
        for status, method, path in _ACCESS.findall(text):
            if name == "emulator" and status == "500" and allowed[f"{method} {path}"] > 0:
                allowed[f"{method} {path}"] -= 1
                continue
            expected = (
                name == "emulator"
                or (status == "502" and (method, path) == ("POST", "/checkout"))
                or (status == "503" and (method, path) == ("POST", "/gateway/callback"))
            )
            if status == "500" or (status.startswith("5") and not expected):
                problems.append(f"{name}: {status} {method} {path}")
        problems.extend(f"{name}.log {found}" for found in tracebacks(text, expected_exception)[1])
    return problems


def signal_counts(stack: Stack, references: Sequence[str], signal: str) -> dict[str, int]:
    rows = fetch_all(
        stack.shop_db,
        "SELECT reference, count(*) FROM reliability_signals WHERE signal = :signal GROUP BY reference",
        signal=signal,
    )
    counted = {str(reference): int(n) for reference, n in rows}
    return {reference: counted.get(reference, 0) for reference in references}


def fulfilment_counts(stack: Stack, references: Sequence[str]) -> dict[str, int]:
    """How often each order was fulfilled: its ``paid`` history rows, written in the same transaction as
    ``paid_at``/``fulfilled_at`` (``example_shop.models.mark_paid``)."""
    rows = fetch_all(
        stack.shop_db,
        "SELECT o.reference, count(e.id) FROM shop_orders o "
        "LEFT JOIN shop_order_events e ON e.order_id = o.id AND e.kind = 'paid' GROUP BY o.reference",
    )
    counted = {str(reference): int(n) for reference, n in rows}
    return {reference: counted.get(reference, 0) for reference in references}


def order_reference(stack: Stack, token: str) -> str:
    rows = fetch_all(stack.shop_db, "SELECT order_reference FROM gateway_checkouts WHERE token = :t", t=token)
    assert len(rows) == 1, rows
    return str(rows[0][0])
