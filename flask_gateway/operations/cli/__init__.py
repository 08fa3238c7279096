"""``flask gateway ...``: create the tables, reconcile, look at one checkout.

- ``flask gateway init-db``: create the extension's ``gateway_*`` tables (only those) when missing.
- ``flask gateway reconcile [--limit N] [--older-than S] [--paid-window HOURS] [--paid-recheck S]
  [--concurrency N]``: poll the checkouts whose outcome the shop may have missed, then the recently paid
  ones for refunds made at the gateway (see :mod:`flask_gateway.operations.reconciliation`); exits 1 when a
  checkout could not be polled, so a cron job reports it.
- ``flask gateway status ORDER_OR_TOKEN [--refresh]``: the local record and the gateway's getstatus answer
  (a checkout given by its order reference or its token, found in the shop's database; see
  :mod:`~flask_gateway.operations.cli.lookup`).
- ``flask gateway refund ORDER_OR_TOKEN [AMOUNT | --all] [--reason TEXT] [--yes]``: the admin screen's
  refund (see :mod:`~flask_gateway.operations.cli.refunds`): exit 0 refunded, 1 not, 75 no answer.
- ``flask gateway checkouts [--status S] [--account ID] [--limit N] [--json]``: the recent checkouts.
- ``flask gateway check-settings``: compare the gateway's settings (callback URL, e-mail, limits) with the
  shop's (see :mod:`flask_gateway.operations.drift`); exits 1 when they differ or the gateway cannot be asked.
- ``flask gateway callbacks [--outcome O] [--refused] [--limit N] [--checkout ORDER_OR_TOKEN]``: the newest
  callbacks received.
- ``flask gateway doctor [--no-network] [--timeout S]``: check what breaks integrations (configuration, the
  firewall, CSRF, the tables, the stored keys, the gateway's settings, the callback at its public URL, the
  schedules) and say how to fix each (see :mod:`flask_gateway.operations.doctor`); exits 1 on a problem.
- ``flask gateway prune-callbacks [--older-than-days N] [--refused]``: delete callback log rows older than
  N days, or every refused (never verified) row now (the checkouts' own history,
  ``gateway_checkout_events``, is kept).
- ``flask gateway rotate-secrets``: re-encrypt the stored secrets still encrypted with an older key
  (``SECRET_KEY_FALLBACKS``, ``GATEWAY_ENCRYPTION_KEY``'s later keys) under the current one, in one
  transaction (see :mod:`~flask_gateway.operations.cli.rotation`); exits 1, changing nothing, when some
  secret cannot be decrypted with any key.

Every command first prints one line to stderr saying what it uses: ``Using database ..., gateway ... at
..., account ...`` (the database URL with its password masked, or a SQLite file's absolute path; the
gateway's environment and base URL; the installed account, or ``not installed``). Then it refuses, with
one line and exit status 78 (``EX_CONFIG``), to run where it could only succeed by accident
(:data:`COMMAND_CHECKS` says which command needs what):

- the app says production (``GATEWAY_ENVIRONMENT="production"``) and the database is SQLite: the
  development database, reached because the command did not load the production environment (unless
  ``GATEWAY_SQLITE_IN_PRODUCTION = True``); checked before the database is opened;
- the ``gateway_*`` tables (or some of their columns) are missing;
- the gateway is not installed for the configured environment.

A command that meets a database outage (``core.outages.is_database_outage``: the server restarting,
refusing or dropping connections) stops with one line, ``Error: the database is unreachable (...)``, and
exit status 75 (``EX_TEMPFAIL``): a cron job or timer runs it again later.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the group.
from flask_gateway.operations.cli import (  # noqa: F401
    accounts,
    callbacks,
    checkouts,
    listing,
    outbox,
    refunds,
    rotation,
    setup,
)
from flask_gateway.operations.cli.group import *  # noqa: F403
from flask_gateway.operations.cli.group import __all__ as __all__
