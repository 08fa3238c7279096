"""A verified callback's claim, checked: the checkout it names (:func:`_find`, two columns, not locked) and
the gateway's getstatus answer about it (:func:`_confirm`, made with no transaction open), with why the
answer does not back the claim (:func:`_disagreement`).

Imports :mod:`flask_gateway.inbound.intake` (a getstatus that fails refuses the callback with 503).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, select

from flask_gateway.core.errors import GatewayError, NotFoundError
from flask_gateway.core.sql import commit_keeping_loaded, storable_text
from flask_gateway.core.wire import (
    PAYMENT_STATUSES,
    CheckoutStatusPayload,
)
from flask_gateway.errors import CallbackConfirmFailed
from flask_gateway.inbound.intake import _reject
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.state import get_state

#: The callback's lookup, built once: the id and status of the v2 checkout with a token (two columns, no
#: ORM entity: the checkout is read whole once, under its row lock, by ``transitions.apply``).
_FIND: Final = select(GatewayCheckout.id, GatewayCheckout.status).where(
    GatewayCheckout.token == bindparam("token"), GatewayCheckout.api_version == "v2"
)


@dataclass(frozen=True)
class _Found:
    """The checkout a callback names, as it was before the callback (not locked)."""

    id: int
    status: str


def _find(token: str) -> _Found | None:
    if "\x00" in token:  # no token has one, and PostgreSQL refuses it in a query
        return None
    row = get_state().session.execute(_FIND, {"token": token}).first()
    return None if row is None else _Found(id=row[0], status=row[1])


def _disagreement(claim: CheckoutStatusPayload, answer: CheckoutStatusPayload) -> str | None:
    """Why getstatus does not back the callback's claim, or None when it does."""
    claimed, confirmed = str(claim.checkoutPaymentStatus), str(answer.checkoutPaymentStatus)
    if answer.checkoutToken != claim.checkoutToken:
        return "getstatus answered about another checkoutToken"
    # The two statuses of one payment: a claim of either agrees with an answer of either.
    if claimed != confirmed and not {claimed, confirmed} <= PAYMENT_STATUSES:
        said, answered = storable_text(claimed, 40), storable_text(confirmed, 40)
        return f"the callback says {said}, getstatus says {answered}"
    if answer.checkoutTotalCents != claim.checkoutTotalCents:
        return (
            f"the callback says a total of {claim.checkoutTotalCents} cents, getstatus "
            f"{answer.checkoutTotalCents}"
        )
    return None


def _confirm(
    log: CallbackLog,
    found: _Found,
    payload: CheckoutStatusPayload,
    account: str,
    signing_key: str,
    client: str | None,
) -> tuple[CheckoutStatusPayload | None, str | None]:
    """Ask the gateway (getstatus) about the claim: (its answer, why it disagrees or None).

    The answer is None when the gateway says it has no such checkout for this account (404): the claim is
    then unconfirmed and nothing is applied. Any other failure refuses the callback with 503.
    """
    state = get_state()
    # Signed with the account's current key (read once with the checkout; a callback the previous key
    # verified is confirmed with the current one, the only one the gateway takes now).
    client_api = state.signed_client(account, signing_key)
    # No transaction (SQLite: no write lock) while the gateway answers. The callback's own transaction
    # committed already: nothing is open here as a rule, and nothing is expired either (the log row stays
    # loaded; ``apply`` reads the checkout under its row lock).
    if state.session.in_transaction():
        commit_keeping_loaded(state.session)
    try:
        answer = client_api.get_status(payload.checkoutToken).data
    except NotFoundError:
        return None, "getstatus: the gateway has no such checkout for the installed account"
    except GatewayError as error:
        _reject(
            CallbackConfirmFailed,
            log,
            f"could not confirm with getstatus ({error.message}); answered 503 so the gateway retries",
            client=client,
            checkout=state.session.get(GatewayCheckout, found.id),
        )
    return answer, _disagreement(payload, answer)
