"""``flask gateway rotate-secrets``: every stored secret re-encrypted under the current key, after a rotation
of ``SECRET_KEY`` (the old one in ``SECRET_KEY_FALLBACKS``) or of ``GATEWAY_ENCRYPTION_KEY`` (``new,old``),
so that the older key can be dropped (:mod:`flask_gateway.operations.rotation`)."""

from __future__ import annotations

from typing import Final

import click
from flask import current_app

from flask_gateway.operations.cli.group import checked, gateway_cli
from flask_gateway.operations.rotation import SecretsUnreadable, rotate_stored_secrets
from flask_gateway.secrets import secret_key_fallbacks
from flask_gateway.state import GatewayState, get_state

#: The runbook (docs/operations.md).
RUNBOOK: Final = "docs/operations.md#rotating-secret_key-and-gateway_encryption_key"


@gateway_cli.command("rotate-secrets")
@checked("rotate-secrets")
def rotate_secrets_command() -> None:
    """Re-encrypt the stored API keys and signing keys under the current key, after a key rotation.

    Those encrypted with an older key (SECRET_KEY_FALLBACKS, or GATEWAY_ENCRYPTION_KEY's later keys) are
    re-encrypted, all in one transaction; the others are left as they are, so a second run changes none.
    Exits 1, changing nothing, when some stored secret cannot be decrypted with any key."""
    state = get_state()
    try:
        done = rotate_stored_secrets(state)
    except SecretsUnreadable as error:
        raise click.ClickException(str(error)) from None
    if done.total == 0:
        click.echo("No stored secrets (nothing is installed): nothing to re-encrypt.")
    else:
        noun = "stored secret" if done.total == 1 else "stored secrets"
        click.echo(
            f"Re-encrypted {done.changed} of {done.total} {noun} under the current key; none still needs "
            "an older key."
        )
    for line in _next_steps(state):
        click.echo(line)


def _next_steps(state: GatewayState) -> list[str]:
    """What the owner may drop now, and what must stay a while longer (never a key, nor a part of one)."""
    lines = []
    box = state.box
    if box.older_keys and box.older_keys_in == "GATEWAY_ENCRYPTION_KEY":
        lines.append(
            "GATEWAY_ENCRYPTION_KEY's older keys are no longer needed: keep only its first key, then restart "
            f"every process ({RUNBOOK})."
        )
    if secret_key_fallbacks(current_app.config):
        stored = (
            "The stored secrets no longer need SECRET_KEY_FALLBACKS"
            if box.older_keys_in == "SECRET_KEY_FALLBACKS"
            else "SECRET_KEY_FALLBACKS protects no stored secret (GATEWAY_ENCRYPTION_KEY does)"
        )
        lines.append(
            f"{stored}; the return links and v1 outcome URLs signed with an older SECRET_KEY stay valid only "
            "while it is listed there: drop it once the checkouts opened before the rotation have expired "
            f"({RUNBOOK})."
        )
    return lines
