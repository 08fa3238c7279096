"""How the checks word what they find: the doctor's User-Agent, the docs pages that several checks' fixes
point to, and small helpers that name the environment, an admin screen and an error's first line. Imports
nothing of the doctor's.
"""

from __future__ import annotations

from typing import Final

from flask_gateway._version import __version__
from flask_gateway.state import GatewayState

#: The callback check's User-Agent: its row in the callback log says where it came from.
USER_AGENT: Final = f"flask-gateway-doctor/{__version__}"


_DOCS_SECRET: Final = "docs/configuration.md#secret_key"  # noqa: S105  (a docs page, no password)
_DOCS_UNREADABLE: Final = "docs/troubleshooting.md#secretunreadable-after-changing-secret_key"
_DOCS_FIREWALL: Final = "docs/troubleshooting.md#403-forbidden-for-localhost-or-ip-addresses"
_DOCS_CSRF: Final = "docs/troubleshooting.md#callbacks-refused-with-400-the-csrf-token-is-missing"
_DOCS_DRIFT: Final = "docs/troubleshooting.md#the-gateways-settings-differ-from-the-shops"
_DOCS_401: Final = "docs/troubleshooting.md#401-from-the-gateway-comparing-with-expectedsignature"
_DOCS_MISSED: Final = "docs/troubleshooting.md#missed-callbacks"
_DOCS_PROBES: Final = "docs/operations.md#health-checks-and-database-outages"
_DOCS_ROTATION: Final = "docs/operations.md#rotating-secret_key-and-gateway_encryption_key"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _environment_label(state: GatewayState) -> str:
    return f"GATEWAY_ENVIRONMENT={state.config.environment!r}"


def _live(state: GatewayState) -> bool:
    """The sandbox or production: the shop is on the internet, the gateway is a real one."""
    return state.config.environment in ("sandbox", "production")


def _admin(state: GatewayState, screen: str) -> str:
    return f"{state.config.url_prefix}/admin/{screen}"
