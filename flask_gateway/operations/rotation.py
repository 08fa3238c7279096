"""The stored secrets after a key rotation: how many still need an older key (``flask gateway doctor``), and
their re-encryption under the current key (``flask gateway rotate-secrets``).

A stored secret is every non-empty value of a column of the extension's tables named ``*_encrypted`` (a
Fernet token of :class:`flask_gateway.secrets.SecretBox`): each installation's API key and signing key,
and any such column added later, of every environment's installations. The current key is
``GATEWAY_ENCRYPTION_KEY``'s first key when it is set, else the one derived from ``SECRET_KEY``; the older
ones are ``GATEWAY_ENCRYPTION_KEY``'s later keys, or ``SECRET_KEY_FALLBACKS``.

Nothing here prints or logs a secret, a key or a ciphertext: only counts and which row and column.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Mapper

from flask_gateway.errors import SecretUnreadable
from flask_gateway.models import GatewayBase
from flask_gateway.state import GatewayState, leaves_no_transaction

__all__ = [
    "COMMAND",
    "Rotation",
    "SecretsSurvey",
    "SecretsUnreadable",
    "encrypted_columns",
    "rotate_stored_secrets",
    "survey_stored_secrets",
]

#: The command that re-encrypts them, as the doctor and the docs name it.
COMMAND: Final = "flask gateway rotate-secrets"
_SUFFIX: Final = "_encrypted"
_WORDS: Final = {"api": "API"}


@dataclass(frozen=True)
class SecretsSurvey:
    """What the stored secrets need: ``older`` and ``unreadable`` name each secret (never its value)."""

    total: int
    #: Readable only with an older key.
    older: list[str] = field(default_factory=list)
    #: Readable with no key the app has.
    unreadable: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Rotation:
    """What ``rotate_stored_secrets`` did: ``changed`` of ``total`` secrets re-encrypted (committed)."""

    total: int
    changed: int


class SecretsUnreadable(SecretUnreadable):
    """Some stored secret decrypts with no key: nothing was re-encrypted. The message names them."""

    def __init__(self, survey: SecretsSurvey) -> None:
        self.survey = survey
        count = len(survey.unreadable)
        shown = "; ".join(survey.unreadable[:5]) + (f"; and {count - 5} more" if count > 5 else "")
        super().__init__(
            f"{count} of {survey.total} stored secret{'s' if survey.total != 1 else ''} cannot be decrypted "
            f"with any key the app has ({shown}): nothing was re-encrypted. Put the key they were stored "
            "with back (SECRET_KEY's in SECRET_KEY_FALLBACKS, or in GATEWAY_ENCRYPTION_KEY after the "
            "current one), or enter that account's keys again on the install screen, then run "
            f"{COMMAND} again."
        )


def encrypted_columns() -> list[tuple[type[Any], tuple[str, ...]]]:
    """Each model of the extension's tables with its columns that hold a stored secret (``*_encrypted``)."""
    found: list[tuple[type[Any], tuple[str, ...]]] = []
    mappers: list[Mapper[Any]] = sorted(GatewayBase.registry.mappers, key=lambda m: m.class_.__name__)
    for mapper in mappers:
        names = tuple(attribute.key for attribute in mapper.column_attrs if attribute.key.endswith(_SUFFIX))
        if names:
            found.append((mapper.class_, names))
    return found


def _label(row: Any, column: str) -> str:
    what = " ".join(_WORDS.get(word, word) for word in column.removesuffix(_SUFFIX).split("_"))
    account = getattr(row, "merchant_account_id", None)
    environment = getattr(row, "environment", None)
    if account is not None:
        where = f"merchant account {account}" + (f" ({environment})" if environment else "")
        return f"the {what} of {where}"
    return f"the {what} of {type(row).__tablename__} row {getattr(row, 'id', '?')}"


def _stored(state: GatewayState, *, lock: bool) -> Iterator[tuple[Any, str, str]]:
    """Each stored secret: its row, its column, and its token (rows locked with ``lock``)."""
    for model, columns in encrypted_columns():
        query = select(model).order_by(*model.__mapper__.primary_key)
        if lock:
            query = query.with_for_update()
        for row in state.session.scalars(query):
            for column in columns:
                token = getattr(row, column)
                if token:
                    yield row, column, token


def _survey(state: GatewayState, stored: list[tuple[Any, str, str]]) -> SecretsSurvey:
    older: list[str] = []
    unreadable: list[str] = []
    for row, column, token in stored:
        try:
            if state.box.needs_older_key(token):
                older.append(_label(row, column))
        except SecretUnreadable:
            unreadable.append(_label(row, column))
    return SecretsSurvey(total=len(stored), older=older, unreadable=unreadable)


def survey_stored_secrets(state: GatewayState) -> SecretsSurvey:
    """How many stored secrets there are, which decrypt only with an older key, which with none (it only
    reads)."""
    return _survey(state, list(_stored(state, lock=False)))


@leaves_no_transaction
def rotate_stored_secrets(state: GatewayState) -> Rotation:
    """Re-encrypt under the current key every stored secret that decrypts only with an older one, in one
    transaction that updates only those (the rows locked meanwhile); the others are left as they are, so a
    second run changes nothing. Raises :class:`SecretsUnreadable`, having changed nothing, when some
    secret decrypts with no key."""
    stored = list(_stored(state, lock=True))
    survey = _survey(state, stored)
    if survey.unreadable:
        raise SecretsUnreadable(survey)
    changed = 0
    for row, column, token in stored:
        if state.box.needs_older_key(token):
            setattr(row, column, state.box.rotate(token))
            changed += 1
    state.session.commit()
    return Rotation(total=survey.total, changed=changed)
