"""An emulator for one shop's tests: :class:`GatewayEmulator`, its life (start, close, the signal record)
and its helpers named for what a test does (install, pay, cancel, expire, deliver, fail or replay a callback).

Imports, in one direction: :mod:`wiring`, :mod:`pool`, :mod:`sqlite`, :mod:`records` and :mod:`assertions`
of this package (none of which imports this one), the extension's state, signals and installation, and the
emulator.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from flask_gateway.core.errors import AlreadyInstalledError
from flask_gateway.core.hosts import local_host_kind
from flask_gateway.core.references import AmbiguousReference, stored_reference
from flask_gateway.core.timestamps import parse_timestamp
from flask_gateway.core.wire import OPEN_STATUSES
from flask_gateway.emulator import EmulatorSettings, embedded_emulator
from flask_gateway.emulator import models as emulator_models
from flask_gateway.emulator.merchant import post_callback
from flask_gateway.payments.installation import InstallSettings, install, update_settings
from flask_gateway.payments.plans import clear_payment_plan_cache
from flask_gateway.signals import (
    callback_rejected,
    checkout_cancelled,
    checkout_expired,
    checkout_flagged,
    payment_confirmed,
)
from flask_gateway.state import get_state
from flask_gateway.testing import assertions
from flask_gateway.testing.assertions import callback_attempts, records_of
from flask_gateway.testing.pool import (
    DEMO_ACCOUNT,
    DEMO_API_KEY,
    EmulatorPool,
    emulator_settings_for,
    make_emulator,
)
from flask_gateway.testing.records import (
    CallbackReply,
    CheckoutRef,
    ConsumerOutcome,
    GatewayEmulatorError,
    GatewayKitWarning,
    SignalRecord,
    token_of,
)
from flask_gateway.testing.sqlite import sqlite_without_fsync
from flask_gateway.testing.wiring import Wiring, connect_configured, shop_base_url
from flask_gateway.urls import callback_url, external_url


def _reset(emulator: Flask) -> None:
    """The control API's reset: no checkout, key, delivery, e-mail, fault or clock offset is left."""
    answer = emulator.test_client().post("/_emulator/reset", json={})
    if answer.status_code != 200:
        raise GatewayEmulatorError(f"The emulator could not be reset: {answer.get_data(as_text=True)}")


def _warn_of_local_return_urls(shop: Flask, *, waf_strict: bool) -> None:
    """A :class:`GatewayKitWarning` when the emulator's firewall (strict, as the real gateway's) will refuse
    every checkout the shop creates: its return URLs would be on localhost or an IP address. The message
    starts with the key to set, so pytest's one-line summary shows it (the create's own error says
    ``create: HTTP 403 Forbidden`` first and the key only on its next line)."""
    public = get_state(shop).config.public_url
    base = shop_base_url(shop)
    kind = local_host_kind(base)
    if not waf_strict or kind is None:
        return
    if public:
        start = f"GATEWAY_PUBLIC_URL={public!r} is on {kind}"
    else:
        start = f"GATEWAY_PUBLIC_URL is not set, so the shop's return URLs are on {base} ({kind})"
    warnings.warn(
        GatewayKitWarning(
            f"{start}: the emulator's firewall refuses them, as the gateway's does, so every checkout the "
            "shop creates fails (create: HTTP 403 Forbidden). Set GATEWAY_PUBLIC_URL to a public address "
            "such as https://shop.example in the test configuration (nothing resolves it: the kit hands "
            "the gateway's calls to the app), or GATEWAY_WAF = 'allow-local'."
        ),
        stacklevel=3,
    )


_WATCHED: Final = {
    "payment_confirmed": payment_confirmed,
    "checkout_cancelled": checkout_cancelled,
    "checkout_expired": checkout_expired,
    "callback_rejected": callback_rejected,
    "checkout_flagged": checkout_flagged,
}


@dataclass
class GatewayEmulator:
    """An in-process emulator wired to one shop, with helpers for the shop's tests (docs/testing.md).

    Build it with :meth:`start` and end it with :meth:`close` (or use it as a context manager). While it
    runs it records the extension's signals for the shop (:attr:`signals`), so a test can assert that an
    order was fulfilled exactly once. Every helper drives the emulator through its control API
    (``/_emulator/...``) with its test client: the code paths of the real emulator.
    """

    shop: Flask
    #: The emulator app.
    app: Flask
    #: How the two are wired; None for an emulator embedded in the shop (``GATEWAY_ENVIRONMENT="embedded"``:
    #: the extension wires it itself).
    wiring: Wiring | None
    #: The emulator's test client (the control API, or anything else of the emulator).
    client: FlaskClient
    account: str = DEMO_ACCOUNT
    api_key: str = DEMO_API_KEY
    #: Every watched signal the extension sent for the shop since :meth:`start`, oldest first.
    signals: list[SignalRecord] = field(default_factory=list)
    _receivers: list[tuple[Any, Callable[..., None]]] = field(default_factory=list, repr=False)
    _client_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Called by :meth:`close`: what :meth:`start` changed on the shop for the test, undone.
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    #: The emulator app was made for this object alone (closed with it).
    _owned: bool = field(default=False, repr=False)

    # --- life ---------------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        shop: Flask,
        *,
        database_url: str,
        settings: EmulatorSettings | None = None,
        install: bool = True,
        minimum_cents: int = 100,
        maximum_cents: int = 10_000_000,
        callback_failures_email: str | None = None,
        pool: EmulatorPool | None = None,
        sqlite_no_fsync: bool = False,
    ) -> GatewayEmulator:
        """An emulator on ``database_url`` wired to ``shop`` (:func:`connect_configured`) and, unless
        ``install`` is false, the gateway installed on the shop with the emulator's demo account.

        With ``pool`` the emulator app comes from it (reset) and stays there after :meth:`close`; without,
        a new one is made and closed with this object. A shop with ``GATEWAY_ENVIRONMENT="embedded"``
        brings its own emulator, already wired: that one is used (reset), and ``database_url``,
        ``settings`` and ``pool`` do not apply.

        ``sqlite_no_fsync``: while it runs, the shop's SQLite file database is written without ``fsync``
        (:func:`sqlite_without_fsync`): a test's database needs no durability against a power cut, and a
        commit then costs microseconds instead of one or more disk flushes. Only when asked: it is the
        shop's database."""
        state = get_state(shop)
        saved = dict(state.client_options)
        embedded = embedded_emulator(shop)
        wiring: Wiring | None = None
        if embedded is not None:
            emulator = embedded.app
            settings = emulator.extensions["gateway_emulator"]
            _warn_of_local_return_urls(shop, waf_strict=settings.waf_strict)  # before anything changes
            _reset(emulator)
        else:
            settings = settings or emulator_settings_for(shop)
            _warn_of_local_return_urls(shop, waf_strict=settings.waf_strict)
            emulator = (
                pool.emulator(database_url, settings) if pool else make_emulator(database_url, settings)
            )
            wiring = connect_configured(shop, emulator)
        account, api_key = next(iter(settings.accounts.items()), (DEMO_ACCOUNT, DEMO_API_KEY))
        gateway = cls(
            shop=shop,
            app=emulator,
            wiring=wiring,
            client=emulator.test_client(),
            account=account,
            api_key=api_key,
            _client_options=saved,
            _owned=embedded is None and pool is None,
        )
        gateway._watch()
        if sqlite_no_fsync:
            gateway._undo.append(sqlite_without_fsync(shop))
        clear_payment_plan_cache()  # plans cached by another test's gateway must not leak into this one
        try:
            if install:
                gateway.install(
                    minimum_cents=minimum_cents,
                    maximum_cents=maximum_cents,
                    callback_failures_email=callback_failures_email,
                )
        except BaseException:
            gateway.close()
            raise
        return gateway

    def close(self) -> None:
        """Stop recording signals, give the shop back its own HTTP settings, close the database connections
        the emulator (and the extension's own SQLite engine) opened."""
        if self._closed:
            return
        self._closed = True
        for signal, receiver in self._receivers:
            # From every sender: blinker keeps a receiver disconnected from one sender only (and with it
            # this object, the shop app and the wiring) for the rest of the process.
            signal.disconnect(receiver)
        self._receivers.clear()
        while self._undo:
            self._undo.pop()()
        state = get_state(self.shop)
        state.client_options.clear()
        state.client_options.update(self._client_options)
        with self.shop.app_context():
            state.dispose()  # the connections the shop's callbacks opened on the extension's own engine
        clear_payment_plan_cache()
        if self._owned:
            with self.app.app_context():
                emulator_models.db.engine.dispose()
        if self.wiring is not None:
            self.wiring.to_emulator.close()
            self.wiring.to_shop.close()

    def __enter__(self) -> GatewayEmulator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _watch(self) -> None:
        for name, signal in _WATCHED.items():

            def receiver(sender: Flask, *, _name: str = name, **kwargs: Any) -> None:
                checkout = kwargs.get("checkout")
                self.signals.append(
                    SignalRecord(
                        signal=_name,
                        token=getattr(checkout, "token", None),
                        order_reference=getattr(checkout, "order_reference", None),
                        source=kwargs.get("source"),
                        reason=kwargs.get("reason"),
                    )
                )

            signal.connect(receiver, sender=self.shop, weak=False)
            self._receivers.append((signal, receiver))

    # --- the shop's side ------------------------------------------------------------------------------

    def install(
        self,
        *,
        minimum_cents: int = 100,
        maximum_cents: int = 10_000_000,
        callback_failures_email: str | None = None,
        account: str | None = None,
        api_key: str | None = None,
    ) -> None:
        """Install the gateway on the shop with the emulator's account (what the owner's install screen
        does), the callback URL on the shop's public address. Once the account is installed, the same
        call changes the installed settings instead (the settings screen's update: the gateway installs
        an account only once).

        ``account``: install another merchant account beside the first (several merchant accounts,
        docs/extension.md). The emulator issues it first if it does not have it (the control API's
        ``POST /_emulator/accounts``, with ``api_key``, by default ``"<account>-api-key"``); its callback
        URL is the account's own path (``/gateway/callback/<account>``). The accounts installed before
        keep their rows, keys and checkouts; the shop's default account is then the newest one still
        open (this one), so a test that pays on a given account names it (``start_checkout(...,
        account=...)``). Without ``account`` (or with the first one's id), exactly the first account as
        before."""
        first = account is None or account == self.account
        merchant_account_id = self.account if first else str(account)
        key = (api_key or self.api_key) if first else self._issue(merchant_account_id, api_key)
        with self.shop.test_request_context(base_url=shop_base_url(self.shop)):
            url = callback_url() if first else external_url("gateway.callback", account=merchant_account_id)
            try:
                install(
                    InstallSettings(
                        merchant_account_id=merchant_account_id,
                        api_key=key,
                        callback_url=url,
                        callback_failures_email=callback_failures_email,
                        minimum_cents=minimum_cents,
                        maximum_cents=maximum_cents,
                    )
                )
            except AlreadyInstalledError:
                update_settings(
                    callback_url=url,
                    callback_failures_email=callback_failures_email,
                    minimum_cents=minimum_cents,
                    maximum_cents=maximum_cents,
                    # This account's settings, not the default account's (the newest one still open).
                    account=merchant_account_id,
                )

    def _issue(self, account: str, api_key: str | None) -> str:
        """The API key of ``account`` at the emulator, issuing the account first when it has none (as the
        account manager would: ``POST /_emulator/accounts``). An account the emulator has keeps its key
        unless ``api_key`` names another one for an account not installed yet."""
        with self.app.app_context():
            row = emulator_models.db.session.get(emulator_models.Account, account)
            known, installed = (row.api_key, row.installed) if row is not None else (None, False)
            emulator_models.db.session.rollback()
        if known is not None and (api_key is None or api_key == known or installed):
            return known
        key = api_key or f"{account}-api-key"
        self.control("accounts", {"merchantAccountId": account, "merchantAccountApiKey": key})
        return key

    # --- the control API ------------------------------------------------------------------------------

    def control(self, path: str, body: Mapping[str, Any] | None = None, *, method: str = "POST") -> Any:
        """Call ``/_emulator/<path>`` and return its JSON answer; an error answer is a
        :class:`GatewayEmulatorError` carrying the emulator's message."""
        payload = dict(body or {}) if method != "GET" else None
        answer = self.client.open(f"/_emulator/{path}", method=method, json=payload)
        data = answer.get_json(silent=True)
        if answer.status_code >= 400:
            message = data.get("message") if isinstance(data, dict) else answer.get_data(as_text=True)[:300]
            raise GatewayEmulatorError(
                f"The emulator refused {method} /_emulator/{path}: HTTP {answer.status_code}: {message}"
            )
        return data

    # --- which checkout -------------------------------------------------------------------------------

    def resolve(self, checkout: object) -> CheckoutRef:
        """The checkout a helper was given, found at the gateway: the one resolver every helper uses.

        ``checkout`` is an order reference or a token alike (a token first, then an order reference: the
        order's most recent checkout), or a ``GatewayCheckout`` (anything with ``.token``), its payment
        page URL, or the shop's response redirecting to it. One the gateway does not have raises
        :class:`GatewayEmulatorError` naming what was given."""
        found = self.find(checkout)
        if found is not None:
            return found
        given = checkout if isinstance(checkout, str) else token_of(checkout)
        raise GatewayEmulatorError(
            f"{given!r} names no checkout at the gateway (neither a checkout token nor an order reference it "
            f"knows): did the shop create one (start_checkout) with this emulator? {self._known()}"
        )

    def find(self, checkout: object) -> CheckoutRef | None:
        """:meth:`resolve`, or None when the gateway has no such checkout (what cannot name a checkout at
        all, such as a page that is not the gateway's, still raises :class:`GatewayEmulatorError`)."""
        if isinstance(checkout, str) and "/" not in checkout:
            given, plain = checkout, True
        else:
            given, plain = token_of(checkout), False
        if not given or "\x00" in given or len(given) > 255:
            return None
        model = emulator_models.Checkout
        with self.app.app_context():
            session = emulator_models.db.session
            try:  # plain values read: the rollback expires the rows
                of_token = session.scalars(
                    select(model.merchant_order_reference).where(model.token == given)
                ).first()
                by_reference = of_token is None and plain
                reference = of_token if of_token is not None else given
                if by_reference:
                    try:
                        reference = stored_reference(session, model.merchant_order_reference, given) or given
                    except AmbiguousReference as error:
                        raise GatewayEmulatorError(str(error)) from None
                order = list(
                    session.scalars(
                        select(model.token)
                        .where(model.merchant_order_reference == reference)
                        .order_by(model.id.desc())
                    ).all()
                )
            finally:
                session.rollback()
        if of_token is None and not (by_reference and order):
            return None
        return CheckoutRef(
            given=given,
            token=given if of_token is not None else order[0],
            order_reference=reference,
            by_reference=by_reference,
            order_tokens=tuple(order),
        )

    def _known(self) -> str:
        """The gateway's newest checkouts in a few words, for a message about one it does not have."""
        rows = self.control("checkouts", method="GET")["checkouts"][:5]
        if not rows:
            return "The gateway has no checkout at all."
        shown = ", ".join(f"{row['merchantOrderReference']} ({row['checkoutToken']})" for row in rows)
        return f"Its newest checkouts: {shown}."

    # --- the gateway's view ---------------------------------------------------------------------------

    def checkout(self, checkout: object) -> dict[str, Any]:
        """The emulator's view of one checkout (``GET /_emulator/checkouts/<token>``): its status,
        ``status`` (the getstatus payload), refunds and timeline (``events``)."""
        data: dict[str, Any] = self.control(f"checkouts/{self.resolve(checkout).token}", method="GET")
        return data

    def status(self, checkout: object) -> str:
        """The checkout's status at the gateway (``checkoutPaymentStatus``)."""
        return str(self.checkout(checkout)["checkoutPaymentStatus"])

    def callbacks(self, checkout: object | None = None) -> list[dict[str, Any]]:
        """Every callback attempt (of one checkout), oldest first: ``url``, ``httpStatus``, ``message``,
        ``ok``, ``requestBody``... (docs/emulator.md)."""
        token = self.resolve(checkout).token if checkout is not None else None
        query = f"?checkoutToken={token}&kind=callback" if token is not None else ""
        attempts: list[dict[str, Any]] = self.control(f"callbacks{query}", method="GET")["callbacks"]
        return attempts

    # --- the consumer ---------------------------------------------------------------------------------

    def pay(self, checkout: object) -> ConsumerOutcome:
        """The shopper pays on the gateway's payment page (the hosted page's Pay button).

        The checkout is then ``PAID_PENDING_CALLBACK`` at the gateway and its callback is due: the shop
        hears of it on :meth:`deliver` (or when the shopper comes back, ``redirect_url``)."""
        return self._outcome(self.control(f"checkouts/{self.resolve(checkout).token}/pay"))

    def cancel_as_consumer(self, checkout: object) -> ConsumerOutcome:
        """The shopper cancels on the gateway's payment page (its Cancel button)."""
        return self._outcome(self.control(f"checkouts/{self.resolve(checkout).token}/cancel"))

    @staticmethod
    def _outcome(data: Mapping[str, Any]) -> ConsumerOutcome:
        return ConsumerOutcome(
            status=str(data["checkoutPaymentStatus"]),
            redirect_url=data.get("redirectUrl"),
            merchant_message=data.get("merchantMessage"),
        )

    # --- time ---------------------------------------------------------------------------------------

    def advance_clock(self, seconds: float) -> dict[str, Any]:
        """Move the gateway's clock forward: what became due happens (expiries, callback retries).

        Answers ``{"now", "offsetSeconds", "expired", "deliveryAttempts"}``. Only the emulator's clock
        moves; the shop's is the real one."""
        data: dict[str, Any] = self.control("clock/advance", {"seconds": seconds})
        return data

    def expire(self, checkout: object) -> dict[str, Any]:
        """Let the checkout's time run out at the gateway: the clock is moved to just past its
        ``expiresAt`` (so every checkout due by then expires too). The shop learns of it as it would
        from the real gateway: on a status poll (``flask_gateway.refresh``, ``reconcile``), or for v1
        from the ABANDONED notice the clock advance delivers."""
        token = self.resolve(checkout).token
        detail = self.checkout(token)
        status = detail["checkoutPaymentStatus"]
        if status not in OPEN_STATUSES:
            raise GatewayEmulatorError(
                f"Checkout {token} is {status} at the gateway: only an open checkout ("
                f"{', '.join(sorted(OPEN_STATUSES))}) can expire. The clock was not moved."
            )
        now = parse_timestamp(self.control("clock", method="GET")["now"])
        due = (parse_timestamp(detail["expiresAt"]) - now).total_seconds()
        answer = self.advance_clock(max(0.0, due) + 1.0)
        status = self.status(token)
        if status != "EXPIRED":  # a v1 checkout the consumer cancelled, for one, does not expire
            raise GatewayEmulatorError(
                f"Checkout {token} is {status} at the gateway after the clock passed its expiresAt, not "
                "EXPIRED."
            )
        return answer

    # --- callbacks ------------------------------------------------------------------------------------

    def deliver(self) -> int:
        """Send the callbacks that are due now (and apply due expiries); how many attempts were made."""
        return int(self.control("deliver")["attempts"])

    def fail_next_callback(self, times: int = 1) -> None:
        """The next ``times`` callback attempts fail as if the shop had answered HTTP 500 (nothing reaches
        the shop); the gateway retries after its delays (:meth:`advance_clock`), then dead-letters."""
        self.control("faults", {"operation": "callback", "kind": "callback_fail", "count": times})

    def time_out_next_callback(self, times: int = 1) -> None:
        """The next ``times`` callback attempts time out (nothing reaches the shop)."""
        self.control("faults", {"operation": "callback", "kind": "callback_timeout", "count": times})

    def replay_callback(self, checkout: object) -> CallbackReply:
        """Send the checkout's last callback again: the same body, freshly signed with the account's key,
        posted to the same URL by the emulator's own callback sender. A shop must answer it (HTTP 200)
        without fulfilling twice."""
        token = self.resolve(checkout).token
        attempts = self.callbacks(token)
        if not attempts:
            raise GatewayEmulatorError(
                f"No callback was sent for checkout {token} yet: pay it and call deliver() first."
            )
        last = attempts[-1]
        with self.app.app_context():
            row = emulator_models.db.session.scalars(
                select(emulator_models.Checkout).where(emulator_models.Checkout.token == token)
            ).one()
            account = emulator_models.db.session.get_one(emulator_models.Account, row.account_id)
            account_id, signing_key = account.merchant_account_id, account.signing_key
            emulator_models.db.session.rollback()
            if not signing_key:
                raise GatewayEmulatorError(f"Account {account_id} has no signing key: is it installed?")
            reply = post_callback(
                last["url"],
                str(last["requestBody"]).encode("utf-8"),
                merchant_account_id=account_id,
                signing_key=signing_key,
            )
        return CallbackReply(ok=reply.ok, http_status=reply.http_status, message=reply.message)

    def redeliver(self, checkout: object) -> CallbackReply:
        """Redeliver the checkout's dead letter (a callback that failed every attempt), as the emulator's
        dashboard button does: back in the outbox and attempted at once."""
        token = self.resolve(checkout).token
        dead = [
            d
            for d in self.control("dead-letters", method="GET")["deadLetters"]
            if d["checkoutToken"] == token
        ]
        if not dead:
            raise GatewayEmulatorError(
                f"Checkout {token} has no dead letter (its callbacks: {callback_attempts(self, token)})"
            )
        answer = self.control(f"dead-letters/{dead[-1]['id']}/redeliver")
        attempt = answer.get("attempt") or {}
        return CallbackReply(
            ok=bool(answer.get("ok")),
            http_status=attempt.get("httpStatus"),
            message=str(attempt.get("message")),
        )

    # --- what the shop did ----------------------------------------------------------------------------

    def confirmations(self, checkout: object) -> list[SignalRecord]:
        """The ``payment_confirmed`` signals sent for ``checkout`` (an order reference: for any checkout of
        that order; a token, a checkout, its payment URL, the shop's redirect to it: for that checkout)
        since the emulator started."""
        return records_of(self.signals, "payment_confirmed", self.resolve(checkout))

    def assert_fulfilled_once(self, checkout: object) -> SignalRecord:
        """Assert that the extension sent ``payment_confirmed`` (the shop's cue to fulfil) exactly once for
        ``checkout`` (an order reference: for the order, whichever of its checkouts was paid; a token, a
        checkout, its payment URL, the shop's redirect to it) during this test; returns that signal's
        record."""
        return assertions.assert_fulfilled_once(self, checkout)

    def assert_not_fulfilled(self, checkout: object) -> None:
        """Assert that ``payment_confirmed`` was never sent for ``checkout`` (as for
        :meth:`assert_fulfilled_once`) during this test; one that names no checkout fails too."""
        assertions.assert_not_fulfilled(self, checkout)
