"""One merchant account per admin request: which account each admin view acts on, and which accounts the
person signed in may see.

**Every view declares its account.** Each view of the ``gateway_admin`` blueprints (the outbox's nested one
too) carries one of the decorators below, under its route decorator, saying how the request's account is
found or that the view is about every account:

- :func:`account_from_row` ``("checkout_id")``: the account of the row the URL names (a checkout, a callback
  log row, an outbox event), whatever the query string says;
- :func:`account_from_path` ``("account")``: the account in the URL (an account's own screens);
- :func:`account_from_query`: ``?account=ID``; without it every account (the lists), or with
  ``default_account=True`` the default account (the settings);
- :func:`account_from_form` ``("merchant_account_id")``: a POST's form field (the install screen); a GET
  is a view of every account;
- :func:`every_account`: a view of every account; ``?account=`` changes nothing.

The stylesheet (each blueprint's ``static``) is of no account. A view without a declaration is refused (403,
and an ERROR log line): :func:`undeclared` lists them, and the tests fail on one.

**Who may see what.** :func:`viewed_account` is the declared account of the request (None for a view of
every account), what the app's admin guard is told. :func:`visible_accounts` is the set of accounts the
person may see: the app's ``@gateway.admin_accounts`` callable, else the installed accounts the admin guard
admits when asked about each one. Before a view runs, ``blueprint._admit`` calls the guard, then refuses a
request for one account outside that set as a 404 (the same answer as for a row or account that does not
exist, so nothing tells the other accounts' rows apart). The views of every account, the account switchers
and the settings incidents' banner show only the accounts of :func:`request_accounts`.

Imports nothing of the package's screens.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from flask import Blueprint, Flask, current_app, g, has_request_context, request
from flask.blueprints import BlueprintSetupState
from sqlalchemy import select

from flask_gateway.errors import ConfigurationError
from flask_gateway.models import CallbackLog, GatewayCheckout, Installation, OutboxEvent
from flask_gateway.state import get_state

__all__ = [
    "AccountSource",
    "account_from_form",
    "account_from_path",
    "account_from_query",
    "account_from_row",
    "acts_on_one_account",
    "declaration",
    "default_installation",
    "every_account",
    "keep_declarations",
    "nav_account",
    "request_accounts",
    "undeclared",
    "viewed_account",
    "visible_accounts",
    "visible_installations",
]

_log = logging.getLogger("flask_gateway.admin")

#: The admin blueprints' names start so (``gateway_admin``, ``gateway_admin.outbox``).
ADMIN_PREFIX: Final = "gateway_admin"
#: Row ids are 32-bit integers on PostgreSQL: a larger one names no row (and must not reach a query).
_MAX_ID: Final = 2**31 - 1
#: The view attribute that holds a declaration.
_ATTRIBUTE: Final = "gateway_account_source"
#: ``app.extensions`` key of the declarations read when the blueprints were registered.
_DECLARATIONS: Final = "gateway.admin_accounts"
#: ``g`` keys, each answer computed once per request.
_VIEWED: Final = "_gateway_viewed_account"
_VISIBLE: Final = "_gateway_visible_accounts"
_UNSET: Final = object()

Kind = Literal["row", "path", "query", "form", "every"]
ViewT = TypeVar("ViewT", bound=Callable[..., Any])

#: The rows a URL can name: the URL argument, what the row is called, the row's id column.
ROWS: Final = {
    "checkout_id": ("checkout", GatewayCheckout.id),
    "log_id": ("callback", CallbackLog.id),
    "event_id": ("outbox event", OutboxEvent.id),
}


@dataclass(frozen=True)
class AccountSource:
    """How an admin view finds the one merchant account it acts on, or that it is about every account."""

    kind: Kind
    #: The URL argument (``row``, ``path``) or the form field (``form``).
    name: str = ""
    #: ``query``: without ``?account=``, the default account (else: every account).
    default_account: bool = False

    def __str__(self) -> str:
        if self.kind == "row":
            return f"the account of the {ROWS[self.name][0]} in the URL ({self.name})"
        if self.kind == "path":
            return f"the account in the URL ({self.name})"
        if self.kind == "query":
            otherwise = "the default account" if self.default_account else "every account"
            return f"?account=, else {otherwise}"
        if self.kind == "form":
            return f"a POST's form field {self.name}, else every account"
        return "every account"


def _declare(source: AccountSource) -> Callable[[ViewT], ViewT]:
    def mark(view: ViewT) -> ViewT:
        setattr(view, _ATTRIBUTE, source)
        return view

    return mark


def account_from_row(argument: str) -> Callable[[ViewT], ViewT]:
    """The view acts on the account of the row its URL names (``checkout_id``, ``log_id``, ``event_id``)."""
    if argument not in ROWS:
        raise ValueError(f"no admin row is named by {argument!r}: one of {', '.join(ROWS)}")
    return _declare(AccountSource("row", argument))


def account_from_path(argument: str = "account") -> Callable[[ViewT], ViewT]:
    """The view acts on the account its URL names (``/accounts/<account>/...``)."""
    return _declare(AccountSource("path", argument))


def account_from_query(*, default_account: bool = False) -> Callable[[ViewT], ViewT]:
    """The view acts on ``?account=ID``; without it on every account, or with ``default_account`` on the
    default account (the newest one still open)."""
    return _declare(AccountSource("query", default_account=default_account))


def account_from_form(field: str) -> Callable[[ViewT], ViewT]:
    """A POST acts on the account its form names in ``field``; a GET is a view of every account."""
    return _declare(AccountSource("form", field))


def every_account(view: ViewT) -> ViewT:
    """The view is about every account: ``?account=`` changes nothing, :func:`viewed_account` is None."""
    return _declare(AccountSource("every"))(view)


#: The stylesheet: no account's data.
_STATIC: Final = AccountSource("every")


def keep_declarations(blueprint: Blueprint) -> None:
    """Read the declarations of ``blueprint``'s views when it is registered on an app (they stay with the
    endpoint even if the app's view function is swapped later, as tests do). Call it after its routes."""

    def record(state: BlueprintSetupState) -> None:
        kept: dict[str, AccountSource] = state.app.extensions.setdefault(_DECLARATIONS, {})
        for endpoint, view in state.app.view_functions.items():
            source = getattr(view, _ATTRIBUTE, None)
            if endpoint.startswith(ADMIN_PREFIX) and isinstance(source, AccountSource):
                kept.setdefault(endpoint, source)

    blueprint.record(record)


def declaration(endpoint: str | None, app: Flask | None = None) -> AccountSource | None:
    """How the admin ``endpoint`` finds its account; None for a view that does not say (refused)."""
    if endpoint is None:
        return None
    app = app or current_app
    kept = app.extensions.get(_DECLARATIONS, {}).get(endpoint)
    if isinstance(kept, AccountSource):
        return kept
    source = getattr(app.view_functions.get(endpoint), _ATTRIBUTE, None)
    if isinstance(source, AccountSource):
        return source
    if endpoint.rsplit(".", 1)[-1] == "static":
        return _STATIC
    return None


def undeclared(app: Flask) -> list[str]:
    """The endpoints of the admin blueprints that do not declare their account (each is refused)."""
    endpoints = {rule.endpoint for rule in app.url_map.iter_rules() if _is_admin(rule.endpoint)}
    return sorted(endpoint for endpoint in endpoints if declaration(endpoint, app) is None)


def _is_admin(endpoint: str) -> bool:
    return endpoint.split(".", 1)[0].startswith(ADMIN_PREFIX)


def _in_admin_request() -> bool:
    return has_request_context() and (request.blueprint or "").startswith(ADMIN_PREFIX)


# --- the request's account ---------------------------------------------------------------------------------


def viewed_account() -> str | None:
    """The merchant account the current admin request acts on, as its view declares it; what the app's
    admin guard is told.

    The account of the checkout, callback or outbox event the URL names (whatever the query string says);
    the account of an account's own URL (retire, reopen); ``?account=`` on the screens that take it (the
    checkout and callback lists, the outbox, the settings, "compare with the gateway now", acknowledging the
    settings incidents), and on the settings screens without it the account they edit (the default
    account); the account a POST of the install screen installs. None for the views of every account (the
    status page, the lists without ``?account=``, the install screen's GET), whatever ``?account=`` says;
    for a row that does not exist or belongs to no checkout; and outside an admin request.

    The value of ``?account=`` is returned as given (it may name no installed account: that page is a 404).
    A guard that limits a person to some accounts is simpler with ``@gateway.admin_accounts`` (the views of
    every account then show only those accounts): see docs/extension.md, "Several merchant accounts".
    """
    if not _in_admin_request():
        return None
    known = g.get(_VIEWED, _UNSET)
    if known is _UNSET:
        source = declaration(request.endpoint)
        known = None if source is None else _find(source)
        setattr(g, _VIEWED, known)
    return known if isinstance(known, str) else None


def acts_on_one_account(source: AccountSource | None = None) -> bool:
    """Whether the current admin request acts on one account (its view's declaration, and for the views
    that may be either, ``?account=`` or a POST's form)."""
    source = source or declaration(request.endpoint)
    if source is None or source.kind == "every":
        return False
    if source.kind == "query":
        return source.default_account or bool(request.args.get("account"))
    if source.kind == "form":
        return request.method == "POST"
    return True


def _find(source: AccountSource) -> str | None:
    args = request.view_args or {}
    if source.kind == "row":
        return _row_account(source.name, args.get(source.name))
    if source.kind == "path":
        value = args.get(source.name)
        return value if isinstance(value, str) else None
    if source.kind == "query":
        asked = request.args.get("account", "")
        if asked:
            return asked
        return _default_account() if source.default_account else None
    if source.kind == "form":
        if request.method != "POST":
            return None
        return request.form.get(source.name, "").strip() or None
    return None


def _row_account(argument: str, key: Any) -> str | None:
    if not isinstance(key, int) or not 0 < key <= _MAX_ID:
        return None
    query = select(GatewayCheckout.merchant_account_id)
    if argument == "log_id":
        query = query.join(CallbackLog, CallbackLog.checkout_id == GatewayCheckout.id)
    elif argument == "event_id":
        query = query.join(OutboxEvent, OutboxEvent.checkout_id == GatewayCheckout.id)
    found: str | None = get_state().session.scalar(query.where(ROWS[argument][1] == key))
    return found


def _default_account() -> str | None:
    """The account the settings screens act on without ``?account=``: the default account (the newest one
    still open), or with every account retired the newest one; None before any installation."""
    installation = _newest(get_state().installations())
    return None if installation is None else installation.merchant_account_id


def _newest(installations: list[Installation]) -> Installation | None:
    open_ones = [row for row in installations if not row.retired]
    rows = open_ones or installations
    return rows[-1] if rows else None


# --- the accounts the person may see ------------------------------------------------------------------------


def visible_accounts() -> frozenset[str] | None:
    """The merchant accounts the person making this admin request may see; None for every account.

    What the app's ``@gateway.admin_accounts`` callable answers; without one, the installed accounts the
    admin guard admits when asked about each (a guard that takes ``account`` is called with each id; one
    that reads :func:`viewed_account` sees each id there), None when it admits them all. Asked once per
    request, after the guard admitted it."""
    if not _in_admin_request():
        return None
    known = g.get(_VISIBLE, _UNSET)
    if known is _UNSET:
        known = _visible()
        setattr(g, _VISIBLE, known)
    return known if isinstance(known, frozenset) else None


def _visible() -> frozenset[str] | None:
    state = get_state()
    chooser = state.admin_guard.accounts
    if chooser is not None:
        return _accounts_answer(chooser())
    guard = state.admin_guard.check
    installed = [row.merchant_account_id for row in state.installations()]
    admitted = frozenset(account for account in installed if guard is not None and _admits(guard, account))
    return None if len(admitted) == len(installed) else admitted


def _accounts_answer(answer: Any) -> frozenset[str] | None:
    if answer is None:
        return None
    if isinstance(answer, str) or not isinstance(answer, Iterable):
        raise ConfigurationError(
            "The @gateway.admin_accounts callable must return a set of merchant account ids (such as "
            f'{{"brand-b"}}) or None for every account, not a {type(answer).__name__}.'
        )
    accounts = frozenset(answer)
    if not all(isinstance(account, str) for account in accounts):
        raise ConfigurationError(
            "The @gateway.admin_accounts callable must return merchant account ids (str)."
        )
    return accounts


def ask_guard(guard: Callable[..., Any], account: str | None) -> Any:
    """The guard's verdict on a request for ``account`` (None: a view of every account): a guard that takes
    ``account`` is given it; one without reads :func:`viewed_account` itself."""
    return guard(account=account) if _takes_account(guard) else guard()


def _takes_account(guard: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(guard).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: called as before
        return False
    return any(
        (p.name == "account" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        or p.kind == p.VAR_KEYWORD
        for p in parameters
    )


def _admits(guard: Callable[..., Any], account: str) -> bool:
    """Whether the guard would let this person into a page of ``account`` (only ``True`` admits)."""
    if _takes_account(guard):
        return guard(account=account) is True
    known = g.get(_VIEWED, _UNSET)
    setattr(g, _VIEWED, account)  # what viewed_account() answers the guard, for the question
    try:
        return guard() is True
    finally:
        setattr(g, _VIEWED, known)


def request_accounts() -> frozenset[str] | None:
    """The accounts the current admin request may show or change: its one account (when the person may see
    it; else none), or for a view of every account those the person may see (None: every account)."""
    visible = visible_accounts()
    if not acts_on_one_account():
        return visible
    account = viewed_account()
    if account is None or (visible is not None and account not in visible):
        return frozenset()
    return frozenset({account})


def visible_installations() -> list[Installation]:
    """The installed accounts the person may see, open and retired, oldest first."""
    installations = get_state().installations()
    visible = visible_accounts()
    if visible is None:
        return installations
    return [row for row in installations if row.merchant_account_id in visible]


def default_installation(installations: Collection[Installation] | None = None) -> Installation | None:
    """Of ``installations`` (else those the person may see), the newest one still open, else the newest."""
    rows = list(installations if installations is not None else visible_installations())
    return _newest(rows)


def nav_account(*, settings: bool = False) -> str | None:
    """The account the admin navigation's links keep (a shop with several accounts): the page's one
    account; for the settings link of a view of every account, when the person may not see every account,
    the newest one they may see (the settings are one account's)."""
    if len(get_state().installations()) < 2:
        return None
    accounts = request_accounts()
    if acts_on_one_account():
        return next(iter(accounts), None) if accounts else None
    if not settings or accounts is None:
        return None
    mine = default_installation()
    return None if mine is None else mine.merchant_account_id
