"""The admin screens' forms (Flask-WTF: every form carries a CSRF token) and money in and out of them.

Owners type amounts in the currency's major unit (``1234.50``); the gateway and our tables use whole
cents: ``flask_gateway.core.money.parse_amount`` is the one conversion, for the forms and the commands.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask_wtf import FlaskForm
from wtforms import BooleanField, IntegerField, PasswordField, StringField
from wtforms.validators import DataRequired, InputRequired, Length, NumberRange, Optional, ValidationError

from flask_gateway.core.money import MAX_CENTS, format_money, format_plain, parse_amount
from flask_gateway.core.wire import EMAIL_PATTERN
from flask_gateway.errors import ConfigurationError
from flask_gateway.state import get_state

__all__ = [
    "MAX_CENTS",
    "ActionForm",
    "AmountField",
    "ApiKeyForm",
    "InstallForm",
    "RefundForm",
    "SettingsForm",
    "format_amount",
    "format_money",
    "parse_amount",
]


#: ``123450`` -> ``"1234.50"`` (for form inputs: what ``parse_amount`` reads back).
format_amount = format_plain


class AmountField(StringField):  # type: ignore[misc]
    """An amount typed in the major unit; ``data`` is whole cents (an ``int``) or None when empty."""

    def process_formdata(self, valuelist: list[str]) -> None:
        self.data = None
        if valuelist and valuelist[0].strip():
            # A ValueError here becomes the field's error (wtforms' process_errors).
            self.data = parse_amount(valuelist[0], symbol=_currency_symbol())

    def _value(self) -> str:
        if self.raw_data:
            return str(self.raw_data[0])
        return format_amount(self.data) if isinstance(self.data, int) else ""


def _currency_symbol() -> str:
    try:
        return get_state().config.currency_symbol
    except ConfigurationError:  # outside an app with the extension: no symbol to strip
        return ""


def _absolute_url(form: Any, field: Any) -> None:
    parts = urlsplit(field.data or "")
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in field.data):
        raise ValidationError("Enter an absolute http(s) URL such as https://shop.example/gateway/callback.")


def _email(form: Any, field: Any) -> None:
    if field.data and EMAIL_PATTERN.match(field.data) is None:
        raise ValidationError("Enter an e-mail address such as owner@shop.example, or leave it empty.")


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


class _Form(FlaskForm):  # type: ignore[misc]
    """Base of the admin forms: Flask-WTF adds the CSRF token field."""


class SettingsForm(_Form):
    """The four gateway settings (installation, and the settings update)."""

    callback_url = StringField(
        "Callback URL",
        filters=[_strip],
        validators=[InputRequired(), Length(max=2048), _absolute_url],
    )
    callback_failures_email = StringField(
        "E-mail for failed callbacks",
        filters=[_strip],
        validators=[Optional(), Length(max=254), _email],
    )
    minimum_amount = AmountField("Minimum order amount", validators=[InputRequired()])
    maximum_amount = AmountField("Maximum order amount", validators=[InputRequired()])

    def validate_maximum_amount(self, field: Any) -> None:
        low = self.minimum_amount.data
        if isinstance(low, int) and isinstance(field.data, int) and low > field.data:
            raise ValidationError("The maximum must not be below the minimum.")


class InstallForm(SettingsForm):
    """Installation: the account issued by the account manager, plus the four settings."""

    merchant_account_id = StringField(
        "Merchant account id", filters=[_strip], validators=[InputRequired(), Length(max=255)]
    )
    api_key = PasswordField("API key", validators=[InputRequired(), Length(max=255)])
    #: After "already installed": the signing key the owner received at the first installation.
    signing_key = PasswordField("Signing key you already have", validators=[Optional(), Length(max=255)])
    confirm_local = BooleanField("I understand: install with this address anyway")


class ApiKeyForm(_Form):
    """A new API key for an installed account (the account manager issued one): proved, then stored."""

    api_key = PasswordField(
        "New API key",
        filters=[_strip],
        validators=[DataRequired(message="Enter the new API key."), Length(max=255)],
    )


class RefundForm(_Form):
    """A refund in two steps: the amount (typed, or "everything that is left"), then its confirmation.

    The first submit only shows the amount for confirmation; the gateway is called only by a submit with
    ``confirmed`` set, whose ``refunded_before`` (the refunded total when the owner confirmed) must still
    be the checkout's, so a refund made meanwhile (another tab) is never repeated unseen.
    """

    amount = AmountField("Amount to refund")
    reason = StringField("Reason (optional)", filters=[_strip], validators=[Optional(), Length(max=1000)])
    #: The "Refund everything that is left" button, instead of a typed amount.
    everything = BooleanField()
    confirmed = BooleanField()
    refunded_before = IntegerField(validators=[Optional(), NumberRange(min=0)])

    def validate_amount(self, field: Any) -> None:
        if self.everything.data and not self.confirmed.data:
            return
        if field.data is None:
            raise ValidationError("Enter the amount to refund, or choose to refund everything that is left.")
        if isinstance(field.data, int) and field.data <= 0:
            raise ValidationError("The refund must be more than zero.")


class ActionForm(_Form):
    """A button (cancel, refresh): nothing but the CSRF token."""
