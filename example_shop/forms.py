"""The shop's forms (Flask-WTF: each carries a CSRF token) and the checks behind their messages."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from flask_wtf import FlaskForm
from wtforms import BooleanField, HiddenField, IntegerField, PasswordField, SelectField, StringField
from wtforms.validators import InputRequired, Length, NumberRange, Optional, ValidationError

from example_shop.cart import MAX_QUANTITY

__all__ = [
    "PROVINCES",
    "ActionForm",
    "AddToCartForm",
    "CheckoutForm",
    "LoginForm",
    "QuantityForm",
    "RefundForm",
    "normalise_phone",
    "parse_rand",
]

#: South Africa's provinces, as the gateway receives them.
PROVINCES: Final = (
    "Eastern Cape",
    "Free State",
    "Gauteng",
    "KwaZulu-Natal",
    "Limpopo",
    "Mpumalanga",
    "Northern Cape",
    "North West",
    "Western Cape",
)
try:
    from wtforms import SelectChoice
except ImportError:  # WTForms before 3.3 takes (value, label) pairs
    _PROVINCE_CHOICES: list[Any] = [("", "Choose a province"), *((name, name) for name in PROVINCES)]
else:
    _PROVINCE_CHOICES = [SelectChoice("", "Choose a province"), *(SelectChoice(name) for name in PROVINCES)]
#: name@host.tld, with the characters a ``mailto:`` link carries as they are: no ``?``, ``&``, ``#``, ``/``,
#: ``%``, quotes or brackets (``a@b.com?subject=...`` would put words into the owner's e-mail).
_EMAIL: Final = re.compile(
    r"[A-Za-z0-9!$'*+=^_`{|}~-]+(?:\.[A-Za-z0-9!$'*+=^_`{|}~-]+)*"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}\Z"
)
_POSTAL_CODE: Final = re.compile(r"[0-9]{4}\Z")
_PHONE_SEPARATORS: Final = dict.fromkeys(map(ord, " -()."), None)
_AMOUNT: Final = re.compile(r"[0-9]+(?:\.[0-9]{1,2})?\Z")


def normalise_phone(text: str) -> str:
    """A South African mobile number in E.164 (``+27821234567``) from ``082 123 4567`` or ``+27 82 ...``.

    Raises ``ValueError`` with the message the shopper sees.
    """
    digits = text.strip().translate(_PHONE_SEPARATORS)
    if digits.startswith("+27"):
        national = digits[3:]
    elif digits.startswith("27") and len(digits) == 11:
        national = digits[2:]
    elif digits.startswith("0"):
        national = digits[1:]
    else:
        national = ""
    if len(national) != 9 or not national.isdigit() or national[0] not in "6789":
        raise ValueError("Enter a South African mobile number, such as 082 123 4567 or +27 82 123 4567.")
    return "+27" + national


def parse_rand(text: str) -> int:
    """Whole cents from an amount in Rand (``"150"``, ``"150.5"``, ``"1 234.50"``, ``"R 99.99"``).

    Raises ``ValueError`` with the message the owner sees.
    """
    value = text.strip().removeprefix("R").replace(" ", "").replace("\u00a0", "")
    if not _AMOUNT.fullmatch(value):
        raise ValueError("Enter an amount in Rand such as 150.00 (digits, with '.' before the cents).")
    try:
        return int(Decimal(value) * 100)
    except InvalidOperation:  # pragma: no cover - the pattern only lets decimals through
        raise ValueError("Enter an amount in Rand such as 150.00.") from None


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _no_control_characters(form: FlaskForm, field: Any) -> None:
    """Refuse NUL and other control characters (never typed; PostgreSQL cannot even store NUL)."""
    if isinstance(field.data, str) and any(ord(char) < 32 or ord(char) == 127 for char in field.data):
        raise ValidationError("Remove the special characters: use letters, digits and punctuation only.")


def _required(what: str) -> InputRequired:
    return InputRequired(message=f"Enter {what}.")


class AddToCartForm(FlaskForm):  # type: ignore[misc]
    quantity = IntegerField(
        "Quantity",
        default=1,
        validators=[
            InputRequired(message="Enter how many you would like."),
            NumberRange(min=1, max=MAX_QUANTITY, message=f"Choose a quantity from 1 to {MAX_QUANTITY}."),
        ],
    )


class QuantityForm(FlaskForm):  # type: ignore[misc]
    """One cart line: a new quantity (0 removes the line)."""

    slug = HiddenField(validators=[InputRequired()])
    quantity = IntegerField(
        "Quantity",
        validators=[
            InputRequired(message="Enter a quantity (0 removes the item)."),
            NumberRange(min=0, max=MAX_QUANTITY, message=f"Choose a quantity from 0 to {MAX_QUANTITY}."),
        ],
    )


class ActionForm(FlaskForm):  # type: ignore[misc]
    """A button that changes something: only the CSRF token."""


class CheckoutForm(FlaskForm):  # type: ignore[misc]
    first_name = StringField(
        "First name",
        filters=[_strip],
        validators=[_required("your first name"), Length(max=60, message="Use at most 60 characters.")],
    )
    last_name = StringField(
        "Last name",
        filters=[_strip],
        validators=[_required("your last name"), Length(max=60, message="Use at most 60 characters.")],
    )
    email = StringField(
        "Email address",
        filters=[_strip],
        validators=[_required("your email address"), Length(max=254, message="Use at most 254 characters.")],
    )
    phone = StringField(
        "Mobile number",
        filters=[_strip],
        validators=[_required("your mobile number")],
        description="For the payment provider's one-time PIN, e.g. 082 123 4567.",
    )
    billing_line1 = StringField(
        "Street address",
        filters=[_strip],
        validators=[_required("the street address"), Length(max=120, message="Use at most 120 characters.")],
    )
    billing_line2 = StringField(
        "Apartment, suite or complex (optional)",
        filters=[_strip],
        validators=[Optional(), Length(max=120, message="Use at most 120 characters.")],
    )
    billing_city = StringField(
        "Town or city",
        filters=[_strip],
        validators=[_required("the town or city"), Length(max=60, message="Use at most 60 characters.")],
    )
    billing_province = SelectField(
        "Province", choices=_PROVINCE_CHOICES, validate_choice=False, validators=[_required("the province")]
    )
    billing_postal_code = StringField(
        "Postal code", filters=[_strip], validators=[_required("the postal code")]
    )
    shipping_same = BooleanField("Deliver to my billing address", default=True)
    #: The reference the order placed from this page will get, signed (``views.checkout``): every submit of
    #: the page, even several at once, names the same order.
    attempt = HiddenField()
    shipping_line1 = StringField("Street address", filters=[_strip])
    shipping_line2 = StringField("Apartment, suite or complex (optional)", filters=[_strip])
    shipping_city = StringField("Town or city", filters=[_strip])
    shipping_province = SelectField("Province", choices=_PROVINCE_CHOICES, validate_choice=False)
    shipping_postal_code = StringField("Postal code", filters=[_strip])

    #: Field names in the order of the page, for the error summary at its top.
    ORDER: Final = (
        "first_name",
        "last_name",
        "email",
        "phone",
        "billing_line1",
        "billing_line2",
        "billing_city",
        "billing_province",
        "billing_postal_code",
        "shipping_line1",
        "shipping_line2",
        "shipping_city",
        "shipping_province",
        "shipping_postal_code",
    )

    def validate_email(self, field: StringField) -> None:
        if field.data and not _EMAIL.match(field.data):
            raise ValidationError("Enter an email address like name@example.com.")

    def validate_phone(self, field: StringField) -> None:
        if field.data:
            try:
                field.data = normalise_phone(field.data)
            except ValueError as error:
                raise ValidationError(str(error)) from None

    @staticmethod
    def _postal_code(field: StringField) -> None:
        if field.data and not _POSTAL_CODE.match(field.data):
            raise ValidationError("Enter the 4-digit postal code, such as 8001.")

    def validate_billing_postal_code(self, field: StringField) -> None:
        self._postal_code(field)

    @staticmethod
    def _province(field: SelectField) -> None:
        if field.data and field.data not in PROVINCES:
            raise ValidationError("Choose the province from the list.")

    def validate_billing_province(self, field: SelectField) -> None:
        self._province(field)

    def validate(self, extra_validators: Any = None) -> bool:
        checked = [
            name for name in self.ORDER if not (self.shipping_same.data and name.startswith("shipping_"))
        ]
        extra = {name: [_no_control_characters] for name in checked}
        for name, validators in (extra_validators or {}).items():
            extra.setdefault(name, []).extend(validators)
        valid: bool = super().validate(extra)
        if self.shipping_same.data:
            return valid
        for name, what in (
            ("shipping_line1", "the delivery street address"),
            ("shipping_city", "the delivery town or city"),
            ("shipping_province", "the delivery province"),
            ("shipping_postal_code", "the delivery postal code"),
        ):
            field = self[name]
            if not field.data:
                field.errors = [*field.errors, f"Enter {what}, or tick 'Deliver to my billing address'."]
                valid = False
        for name in ("shipping_line1", "shipping_line2"):
            if self[name].data and len(self[name].data) > 120:
                self[name].errors = [*self[name].errors, "Use at most 120 characters."]
                valid = False
        if self.shipping_city.data and len(self.shipping_city.data) > 60:
            self.shipping_city.errors = [*self.shipping_city.errors, "Use at most 60 characters."]
            valid = False
        for name, check in (
            ("shipping_postal_code", self._postal_code),
            ("shipping_province", self._province),
        ):
            try:
                check(self[name])
            except ValidationError as error:
                self[name].errors = [*self[name].errors, str(error)]
                valid = False
        return valid

    def address(self, prefix: str) -> dict[str, str]:
        return {
            "line1": self[f"{prefix}_line1"].data or "",
            "line2": self[f"{prefix}_line2"].data or "",
            "city": self[f"{prefix}_city"].data or "",
            "province": self[f"{prefix}_province"].data or "",
            "postal_code": self[f"{prefix}_postal_code"].data or "",
        }

    def errors_in_order(self) -> list[tuple[str, str, str]]:
        """``(field id, label, first message)`` for the error summary, in page order."""
        found = []
        for name in self.ORDER:
            field = self[name]
            if field.errors:
                found.append((field.id, str(field.label.text), str(field.errors[0])))
        return found


class LoginForm(FlaskForm):  # type: ignore[misc]
    password = PasswordField("Password", validators=[InputRequired(message="Enter the owner password.")])
    next = HiddenField()


class RefundForm(FlaskForm):  # type: ignore[misc]
    """A refund in two steps: the amount (typed, or "everything that is left"), then its confirmation.

    Only a submit with ``confirmed`` refunds; ``refunded_before`` is the refunded total the owner saw when
    confirming, so a refund made meanwhile (another tab, a double submit) is never repeated unseen.
    """

    amount = StringField("Amount to refund (R)", filters=[_strip])
    #: The "Refund everything that is left" button, instead of a typed amount.
    everything = BooleanField()
    confirmed = BooleanField()
    refunded_before = IntegerField(validators=[Optional(), NumberRange(min=0)])
    reason = StringField(
        "Reason (optional)",
        filters=[_strip],
        validators=[
            Optional(),
            Length(max=200, message="Use at most 200 characters."),
            _no_control_characters,
        ],
    )

    def validate_amount(self, field: StringField) -> None:
        self.cents = 0
        if self.everything.data and not self.confirmed.data:
            return
        if not field.data:
            raise ValidationError("Enter the amount to refund, or choose to refund everything that is left.")
        try:
            cents = parse_rand(field.data)
        except ValueError as error:
            raise ValidationError(str(error)) from None
        if cents <= 0:
            raise ValidationError("Enter an amount above R 0.00.")
        self.cents = cents
