"""Outbox delivery end to end over real sockets.

The emulator runs as its own server process (``flask --app flask_gateway.emulator run``) with its
background worker; the merchant's callback receiver is a stdlib HTTP server in a thread, and the failure
e-mails go to a real SMTP server (aiosmtpd) on loopback. Nothing here drives delivery by hand: the
worker must do it. The emulator's database is SQLite or PostgreSQL (``database_url``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from aiosmtpd.controller import Controller

from flask_gateway.core import GatewayClient
from flask_gateway.core.signing import verify
from flask_gateway.core.wire import CreateCheckoutRequest, InstallRequest
from tests import secret_watch
from tests.emulator.support import ACCOUNT, API_KEY, create_body
from tests.processes import WAIT_DEADLINE, free_port, wait_for

# A server process whose delivery worker thread writes beside the requests.
pytestmark = pytest.mark.backends

EMAIL = "ops@shop.example"


@dataclass
class Emulator:
    """The emulator's server process: its base URL and its log (shown when a wait fails)."""

    url: str
    log: Path


# --- the merchant's callback receiver -----------------------------------------------------------------


@dataclass
class Receiver:
    """Answers callbacks with ``statuses`` in turn (the last one from then on) and keeps what came."""

    statuses: list[int]
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def take(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            self.received.append((headers, body))
            return self.statuses[min(len(self.received), len(self.statuses)) - 1]

    def snapshot(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.received)


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    servers: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def start(*statuses: int) -> Receiver:
        state = Receiver(list(statuses))

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = state.take({k.lower(): v for k, v in self.headers.items()}, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        state.url = f"http://127.0.0.1:{server.server_address[1]}/gateway/callback"
        return state

    try:
        yield start
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(5)


# --- a real SMTP server ---------------------------------------------------------------------------------


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd's hook name
        with self.lock:
            message = message_from_bytes(envelope.original_content or envelope.content, policy=policy.default)
            self.messages.append(message)  # type: ignore[arg-type]
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 Message accepted for delivery"

    def snapshot(self) -> list[EmailMessage]:
        with self.lock:
            return list(self.messages)


@pytest.fixture
def smtp() -> Iterator[tuple[Mailbox, int]]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield mailbox, port
    finally:
        controller.stop()


# --- the emulator as a server process ---------------------------------------------------------------------


@pytest.fixture
def emulator(tmp_path: Path, database_url: str, smtp: tuple[Mailbox, int]) -> Iterator[Emulator]:
    """The emulator's server (on SQLite or PostgreSQL); the process is terminated afterwards whatever
    happens."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMULATOR_", "FLASK_"))}
    env.update(
        EMULATOR_DATABASE_URL=database_url,
        EMULATOR_CALLBACK_RETRY_DELAYS="0.2,0.2",
        EMULATOR_WAF="allow-local",
        EMULATOR_SMTP_URL=f"smtp://127.0.0.1:{smtp[1]}",
        EMULATOR_SECRET_KEY="real-http-test-secret",
        FLASK_SKIP_DOTENV="1",
        PYTHONUNBUFFERED="1",
    )
    log_path = tmp_path / "emulator.log"
    secret_watch.watch_file(log_path)  # scanned for secrets at the end of the session
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "flask_gateway.emulator", "run", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:

            def answers() -> bool:
                if process.poll() is not None:
                    pytest.fail(f"the emulator exited ({process.returncode}):\n{log_path.read_text()}")
                try:
                    return requests.get(f"{base}/_emulator/clock", timeout=10).status_code == 200
                except requests.RequestException:  # not listening yet, or too busy starting to answer
                    return False

            wait_for(answers, timeout=2 * WAIT_DEADLINE, what="the emulator to answer", logs=[log_path])
            yield Emulator(base, log_path)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - a stuck server
                process.kill()
                process.wait(10)


def install(base: str, callback_url: str, *, email: str | None = None) -> tuple[GatewayClient, str]:
    body: dict[str, Any] = {
        "merchantAccountId": ACCOUNT,
        "merchantAccountApiKey": API_KEY,
        "checkoutStatusCallbackUrl": callback_url,
        "minimumCheckoutAmountCents": 100,
        "maximumCheckoutAmountCents": 10_000_000,
    }
    if email:
        body["callbackFailuresEmail"] = email
    answer = GatewayClient(base_url=base, merchant_account_id=ACCOUNT).install(
        InstallRequest.model_validate(body)
    )
    key = answer.data.secretSigningKey.get_secret_value()
    return GatewayClient(base_url=base, merchant_account_id=ACCOUNT, signing_key=key), key


def create_and_pay(base: str, client: GatewayClient) -> tuple[str, str]:
    created = client.create_checkout(CreateCheckoutRequest.model_validate(create_body())).data
    paid = requests.post(f"{base}/_emulator/checkouts/{created.checkoutToken}/pay", json={}, timeout=10)
    assert paid.status_code == 200, paid.text
    assert paid.json()["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    return created.checkoutToken, str(created.paymentUrl)


def test_worker_delivers_a_signed_callback_after_two_failures(emulator: Emulator, receiver):
    merchant = receiver(500, 500, 200)
    client, key = install(emulator.url, merchant.url)
    token, payment_url = create_and_pay(emulator.url, client)

    def paid() -> bool:
        return client.get_status(token).data.checkoutPaymentStatus == "PAID"

    wait_for(paid, interval=0.05, what="the background worker to deliver the callback", logs=[emulator.log])
    status = client.get_status(token).data
    assert status.lastCallbackAttemptStatusMessage == "OK"

    received = merchant.snapshot()
    assert len(received) == 3
    for headers, body in received:
        assert headers["x-merchant-account-id"] == ACCOUNT
        assert verify(body, key, headers["x-signature"])
    bodies = [json.loads(body) for _, body in received]
    assert [b["lastCallbackAttemptStatusMessage"] for b in bodies] == [None, "HTTP 500", "HTTP 500"]
    assert all(b["checkoutToken"] == token for b in bodies)
    assert all(b["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK" for b in bodies)
    assert all(b["paymentUrl"] == payment_url for b in bodies)  # the worker knows the emulator's address

    log = requests.get(f"{emulator.url}/_emulator/callbacks", timeout=10).json()["callbacks"]
    assert [(a["number"], a["httpStatus"], a["ok"]) for a in log] == [
        (1, 500, False),
        (2, 500, False),
        (3, 200, True),
    ]
    assert [a["requestBody"].encode() for a in log] == [body for _, body in received]
    assert requests.get(f"{emulator.url}/_emulator/dead-letters", timeout=10).json()["deadLetters"] == []


def test_dead_letter_and_three_emails_over_smtp(emulator: Emulator, receiver, smtp):
    mailbox, _ = smtp
    merchant = receiver(500)
    client, _ = install(emulator.url, merchant.url, email=EMAIL)
    token, _ = create_and_pay(emulator.url, client)

    def dead_letters() -> Any:
        return requests.get(f"{emulator.url}/_emulator/dead-letters", timeout=10).json()["deadLetters"]

    [dead] = wait_for(
        dead_letters, interval=0.05, what="the callback to be dead-lettered", logs=[emulator.log]
    )
    assert dead["checkoutToken"] == token
    assert dead["attempts"] == 3
    assert [a["httpStatus"] for a in dead["attemptLog"]] == [500, 500, 500]
    assert len(merchant.snapshot()) == 3
    status = client.get_status(token).data
    assert status.checkoutPaymentStatus == "PAID_PENDING_CALLBACK"
    assert status.lastCallbackAttemptStatusMessage == "HTTP 500"

    messages = wait_for(
        lambda: len(mailbox.snapshot()) >= 3 and mailbox.snapshot(),
        interval=0.05,
        what="three e-mails at the SMTP server",
        logs=[emulator.log],
    )
    assert len(messages) == 3
    assert mailbox.envelopes == [("gateway-emulator@localhost", [EMAIL])] * 3
    for number, message in enumerate(messages, start=1):
        assert message["From"] == "gateway-emulator@localhost"
        assert message["To"] == EMAIL
        assert message["Subject"] == f"Checkout callback failed (attempt {number} of 3): {token}"
        text = message.get_content().replace("\r\n", "\n")  # SMTP lines end in CRLF
        assert "Error:            HTTP 500" in text
        detail = json.loads(text.split("Checkout detail at the time of failure:\n", 1)[1])
        assert detail["checkoutToken"] == token
        assert detail["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
        assert detail["lastCallbackAttemptStatusMessage"] == "HTTP 500"

    def recorded_as_sent() -> bool:
        stored = requests.get(f"{emulator.url}/_emulator/emails", timeout=10).json()["emails"]
        return [e["smtpResult"] for e in stored] == ["sent"] * 3

    wait_for(
        recorded_as_sent,
        interval=0.05,
        what="the outbox to record the three e-mails as sent",
        logs=[emulator.log],
    )
