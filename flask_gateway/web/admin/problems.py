"""What the admin screens tell the owner when an action fails: the errors it expects, in people's words.

Never request data or secrets (a pydantic error's text repeats the input values). Imports nothing of the
package.
"""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError as ModelValidationError

from flask_gateway.core.errors import GatewayError
from flask_gateway.errors import NotInstalledError, SecretUnreadable

#: What an action can raise that the owner should read (anything else is a bug: a 500 and a log line).
_EXPECTED: Final = (GatewayError, ValueError, NotInstalledError, SecretUnreadable)


def _problem(error: Exception) -> str:
    """What to tell the owner: the gateway's message and field errors; never request data or secrets."""
    if isinstance(error, ModelValidationError):
        # Never str(error): pydantic's text repeats the input values, which may include a secret.
        return "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}"
            for e in error.errors(include_input=False, include_url=False)
        )
    if isinstance(error, GatewayError):
        text = error.message
        if error.http_status is not None:
            text += f" (HTTP {error.http_status})"
        if error.field_errors:
            text += ": " + "; ".join(f"{e['field']}: {e['message']}" for e in error.field_errors)
        return text
    return str(error)
