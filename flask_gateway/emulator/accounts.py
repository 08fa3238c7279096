"""The accounts "issued by the account manager" (``EMULATOR_ACCOUNTS``), seeded on first use and on reset."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from flask_gateway.emulator.models import Account, ClockState, db
from flask_gateway.emulator.settings import EmulatorSettings

__all__ = ["seed_accounts"]


def seed_accounts(settings: EmulatorSettings) -> None:
    """Create the accounts of ``EMULATOR_ACCOUNTS`` that do not exist yet, and the clock row.

    Every worker process of a server does this on its first use of the database, possibly at the same
    moment: a row another process inserted after this one looked (a unique violation, at the commit or at
    an autoflush) means it is seeded. The lookups do not autoflush, and a conflict is retried once, so
    whatever the other process left out is still added.
    """
    for _ in range(2):
        try:
            with db.session.no_autoflush:
                for account_id, api_key in settings.accounts.items():
                    if db.session.get(Account, account_id) is None:
                        db.session.add(Account(merchant_account_id=account_id, api_key=api_key))
                if db.session.get(ClockState, 1) is None:
                    db.session.add(ClockState(id=1, offset_seconds=0.0))
            db.session.commit()
            return
        except IntegrityError:  # another worker process seeded some of them first
            db.session.rollback()
