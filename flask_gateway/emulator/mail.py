"""Callback failure e-mails: stored in the outbox table (``Email``) and, optionally, sent over SMTP.

One e-mail per failed callback attempt goes to the account's ``callbackFailuresEmail`` (when set). It
carries the checkout detail at the time of failure: the status payload as the gateway reports it right
after the failed attempt was recorded, plus the attempt number, the URL and the error.

Format (plain text, UTF-8)::

    From: gateway-emulator@localhost
    To: <callbackFailuresEmail>
    Subject: Checkout callback failed (attempt 2 of 3): <checkoutToken>

    The checkout status callback to your checkoutStatusCallbackUrl failed.

    Merchant account: demo-merchant
    Checkout token:   v2.demo-merchant.…
    Attempt:          2 of 3
    Attempted at:     2024-05-01T10:00:02.000Z
    Callback URL:     https://shop.example/gateway/callback
    Error:            HTTP 500
    Next:             another attempt at 2024-05-01T10:00:12.000Z
                      (or: no attempts left: the callback was moved to the dead letter queue)

    Checkout detail at the time of failure:
    { ...the 16-key status payload, indented... }

With ``EMULATOR_SMTP_URL`` set (``smtp://[user:password@]host[:port]``, or ``smtps://`` for implicit
TLS), each e-mail is also sent with :mod:`smtplib`; the outcome is stored in ``Email.smtp_result``
(``"sent"`` or ``"error: ..."``; ``None`` when no SMTP server is configured). SMTP never breaks a
delivery: every error is caught and recorded.
"""

from __future__ import annotations

import json
import smtplib
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from flask_gateway.core.timestamps import format_timestamp
from flask_gateway.emulator.models import Email

__all__ = [
    "FROM_ADDRESS",
    "SMTP_TIMEOUT",
    "FailureNotice",
    "compose_failure_email",
    "describe_email",
    "send_smtp",
]

#: The sender of every e-mail the emulator writes.
FROM_ADDRESS: Final = "gateway-emulator@localhost"
#: Seconds before an SMTP conversation is given up (the error is recorded, delivery goes on).
SMTP_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class FailureNotice:
    """What one failed callback attempt was, for its e-mail."""

    account_id: str
    to: str
    checkout_token: str
    attempt: int
    max_attempts: int
    attempted_at: datetime
    url: str
    error: str
    #: When the next attempt is due; None when the delivery went to the dead letter queue.
    next_attempt_at: datetime | None
    #: The status payload (wire dict) right after the failure was recorded.
    checkout_detail: dict[str, Any]


def compose_failure_email(notice: FailureNotice, at: datetime) -> Email:
    """The ``Email`` row for a failed attempt (not added to the session; the caller does that)."""
    subject = (
        f"Checkout callback failed (attempt {notice.attempt} of {notice.max_attempts}): "
        f"{notice.checkout_token}"
    )
    if notice.next_attempt_at is not None:
        next_step = f"another attempt at {format_timestamp(notice.next_attempt_at)}"
    else:
        next_step = "no attempts left: the callback was moved to the dead letter queue"
    body = "\n".join(
        [
            "The checkout status callback to your checkoutStatusCallbackUrl failed.",
            "",
            f"Merchant account: {notice.account_id}",
            f"Checkout token:   {notice.checkout_token}",
            f"Attempt:          {notice.attempt} of {notice.max_attempts}",
            f"Attempted at:     {format_timestamp(notice.attempted_at)}",
            f"Callback URL:     {notice.url}",
            f"Error:            {notice.error}",
            f"Next:             {next_step}",
            "",
            "Checkout detail at the time of failure:",
            json.dumps(notice.checkout_detail, indent=2),
            "",
        ]
    )
    return Email(at=at, account_id=notice.account_id, to=notice.to, subject=subject[:255], body=body)


def describe_email(email: Email) -> dict[str, Any]:
    """An e-mail as ``GET /_emulator/emails`` shows it."""
    return {
        "id": email.id,
        "at": format_timestamp(email.at),
        "merchantAccountId": email.account_id,
        "from": FROM_ADDRESS,
        "to": email.to,
        "subject": email.subject,
        "body": email.body,
        "smtpResult": email.smtp_result,
    }


def send_smtp(smtp_url: str, *, to: str, subject: str, body: str, at: datetime) -> str:
    """Send one plain-text e-mail; answers ``"sent"`` or ``"error: ..."`` and never raises."""
    message = EmailMessage()
    message["From"] = FROM_ADDRESS
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = format_datetime(at)
    message["Message-ID"] = make_msgid(domain="gateway-emulator.localhost")
    message.set_content(body)
    try:
        parts = urlsplit(smtp_url)
        scheme = parts.scheme.lower()
        if scheme not in ("smtp", "smtps") or not parts.hostname:
            return f"error: EMULATOR_SMTP_URL must look like smtp://host:port, got scheme {scheme!r}"
        smtp_class = smtplib.SMTP_SSL if scheme == "smtps" else smtplib.SMTP
        port = parts.port or (465 if scheme == "smtps" else 25)
        with smtp_class(parts.hostname, port, timeout=SMTP_TIMEOUT) as server:
            if parts.username:
                server.login(unquote(parts.username), unquote(parts.password or ""))
            server.send_message(message, from_addr=FROM_ADDRESS, to_addrs=[to])
    except (OSError, smtplib.SMTPException, ValueError) as exc:
        return f"error: {type(exc).__name__}: {exc}"[:255]
    return "sent"
