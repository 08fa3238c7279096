"""The gateway's wire names that carry the operator's name, in the two sets we speak.

The real gateway (PayJustNow) names three things after itself: the order-details object of v2 create and
update requests and answers (``payjustnow``), the gateway's own order number in the status payload
(``payjustnowOrderReference``) and the v1 merchant reply's flag (``cancel_on_payjustnow``). The spec we
build from replaces the operator's name with a neutral word (its "naming note"): ``service``,
``serviceOrderReference``, ``cancel_on_service``.

``OPERATOR`` is what the real gateway and every real client say; ``SPEC`` is the spec's neutral form.
This module is the only place that spells either: models read both sets, and write the set they are
given (``WireModel.to_wire(names=...)``). The Python attribute of each such field is a neutral role name
(``order_details``, ``gatewayOrderReference``, ``cancel_on_gateway``), so no code outside this module
depends on a set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from pydantic import AliasChoices

__all__ = [
    "OPERATOR",
    "ROLES",
    "SPEC",
    "WIRE_NAME_SETS",
    "Role",
    "WireNames",
    "accepted",
    "spellings",
    "wire_names",
]

#: The three renamed fields, by role.
Role = Literal["order_details", "order_reference", "cancel_on_gateway"]
ROLES: Final[tuple[Role, ...]] = ("order_details", "order_reference", "cancel_on_gateway")


@dataclass(frozen=True)
class WireNames:
    """One spelling of the three renamed fields."""

    #: ``operator`` or ``spec``: the value of ``GATEWAY_WIRE_NAMES`` / ``EMULATOR_WIRE_NAMES``.
    key: str
    #: v2 create/update requests and create/update/cancel answers: the object of order details.
    order_details: str
    #: The status payload (getstatus answer and callback body): the gateway's order number.
    order_reference: str
    #: The v1 merchant reply (fail URL): whether the gateway cancels the order.
    cancel_on_gateway: str

    def name(self, role: Role) -> str:
        name: str = getattr(self, role)
        return name


OPERATOR: Final = WireNames(
    key="operator",
    order_details="payjustnow",
    order_reference="payjustnowOrderReference",
    cancel_on_gateway="cancel_on_payjustnow",
)
SPEC: Final = WireNames(
    key="spec",
    order_details="service",
    order_reference="serviceOrderReference",
    cancel_on_gateway="cancel_on_service",
)

WIRE_NAME_SETS: Final[dict[str, WireNames]] = {OPERATOR.key: OPERATOR, SPEC.key: SPEC}


def wire_names(key: str) -> WireNames:
    """The set named ``key`` (``operator`` or ``spec``); ``ValueError`` naming the choices otherwise."""
    try:
        return WIRE_NAME_SETS[key.strip().lower()]
    except (KeyError, AttributeError):
        choices = " or ".join(repr(k) for k in WIRE_NAME_SETS)
        raise ValueError(f"unknown wire-name set {key!r}: use {choices}") from None


def spellings(role: Role) -> tuple[str, ...]:
    """Every spelling of ``role`` that is read, the operator's first."""
    return tuple(names.name(role) for names in WIRE_NAME_SETS.values())


def accepted(role: Role) -> AliasChoices:
    """What a model reads for ``role``: every spelling, the operator's first, so that a missing field is
    named as the real gateway names it."""
    first, *others = spellings(role)
    return AliasChoices(first, *others)
