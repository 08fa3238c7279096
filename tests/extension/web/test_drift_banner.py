"""Every gateway admin page shows the settings found changed at the gateway (the foreign value, when, whether
put back or under attack) until a person acknowledges them (issue 29, point 1)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select, text

from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import SettingsIncident
from flask_gateway.operations import drift
from flask_gateway.state import get_state
from tests.extension.conftest import SHOP_URL, Harness
from tests.extension.operations.test_drift import ATTACKER_URL, sandbox_signed_patch

ADMIN = "/gateway/admin"
#: The admin pages a person reads (each extends the admin layout).
PAGES = (f"{ADMIN}/", f"{ADMIN}/checkouts", f"{ADMIN}/callbacks", f"{ADMIN}/settings", f"{ADMIN}/outbox/")
_TOKEN = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"')
_INCIDENT = re.compile(r'name="incident" value="(\d+)"')


@pytest.fixture
def admin(harness: Harness) -> Harness:
    harness.install()
    harness.gateway.admin_guard(lambda: True)
    harness.shop.config["WTF_CSRF_ENABLED"] = True
    return harness


def check(h: Harness) -> drift.DriftReport:
    with h.shop.app_context():
        (account,) = drift.scheduled_check(force=True).checks
    assert account.report is not None, account.error
    return account.report


def page(h: Harness, client: Any, url: str = f"{ADMIN}/") -> str:
    answer = client.get(url)
    assert answer.status_code == 200, url
    return str(answer.get_data(as_text=True))


def acknowledge(client: Any, shown: str, **extra: str) -> Any:
    token = _TOKEN.search(shown)
    assert token is not None
    return client.post(
        f"{ADMIN}/settings-incidents/acknowledge",
        data={"csrf_token": token.group(1), "incident": _INCIDENT.findall(shown), **extra},
    )


def open_incidents(h: Harness) -> list[SettingsIncident]:
    with h.shop.app_context():
        rows = drift.open_incidents()
        get_state().session.expunge_all()
    return rows


def test_the_banner_is_on_every_admin_page_until_acknowledged(admin: Harness) -> None:
    client = admin.client
    for url in PAGES:
        assert "data-drift-banner" not in page(admin, client, url)  # nothing found: no banner

    sandbox_signed_patch(admin, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    assert check(admin).repaired == ["callback URL"]
    (incident,) = open_incidents(admin)

    for url in PAGES:
        shown = page(admin, client, url)
        assert 'data-drift-banner="repaired"' in shown, url
        assert f'data-drift-incident="{incident.id}" data-drift-outcome="repaired"' in shown, url
        assert (
            f"<code>{ATTACKER_URL}</code>" in shown and f"<code>{SHOP_URL}/gateway/callback</code>" in shown
        )
        assert "Put back " in shown and "UTC" in shown  # when, in GATEWAY_TIMEZONE (UTC here)

    shown = page(admin, client, f"{ADMIN}/checkouts")
    answer = acknowledge(client, shown, by="Thandi Mokoena", next=f"{ADMIN}/checkouts?")
    assert answer.status_code == 302 and answer.headers["Location"].endswith(f"{ADMIN}/checkouts")
    for url in PAGES:
        assert "data-drift-banner" not in page(admin, client, url), url
    with admin.shop.app_context():
        row = get_state().session.scalars(select(SettingsIncident)).one()
        assert row.acknowledged_by == "Thandi Mokoena" and row.acknowledged_at is not None


def test_an_attack_says_the_setting_is_left_alone_until_acknowledged(admin: Harness) -> None:
    client = admin.client
    sandbox_signed_patch(admin, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    check(admin)
    sandbox_signed_patch(admin, {"checkoutStatusCallbackUrl": ATTACKER_URL + "/again"})
    assert check(admin).under_attack == ["callback URL"]

    shown = page(admin, client)
    assert 'data-drift-banner="attack"' in shown
    assert "under attack" in shown and "Not put back" in shown
    assert f"<code>{ATTACKER_URL}/again</code>" in shown
    assert acknowledge(client, shown).status_code == 302  # no name given: the address is recorded
    assert "data-drift-banner" not in page(admin, client)
    with admin.shop.app_context():
        by = set(get_state().session.scalars(select(SettingsIncident.acknowledged_by)))
    assert by == {"an admin at 127.0.0.1"}
    assert check(admin).repaired == ["callback URL"]  # acknowledged: the next check puts the shop's back


def test_an_incident_found_after_the_page_was_drawn_stays_open(admin: Harness) -> None:
    client = admin.client
    sandbox_signed_patch(admin, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    check(admin)
    shown = page(admin, client)
    sandbox_signed_patch(admin, {"callbackFailuresEmail": "thief@evil.example"})
    check(admin)  # found while the person reads the page

    assert acknowledge(client, shown).status_code == 302
    (still,) = open_incidents(admin)
    assert still.setting == "failure e-mail"
    assert "thief@evil.example" in page(admin, client)


def test_the_foreign_value_is_escaped_and_next_stays_on_the_admin(admin: Harness) -> None:
    with admin.shop.app_context():
        now = utcnow()
        session = get_state().session
        session.add(
            SettingsIncident(
                environment=get_state().config.environment,
                merchant_account_id="demo-merchant",
                setting="callback URL",
                foreign_value='https://x.example/"><script>alert(1)</script>',
                our_value=f"{SHOP_URL}/gateway/callback",
                outcome="repaired",
                found_at=now,
                last_seen_at=now,
                repaired_at=now,
            )
        )
        session.commit()
    client = admin.client
    shown = page(admin, client)
    assert "<script>alert(1)</script>" not in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
    for target in ("https://evil.example/gateway/admin/", "//evil.example/", "/shop/cart"):
        answer = acknowledge(client, shown, next=target)
        assert answer.status_code == 302 and answer.headers["Location"].endswith(f"{ADMIN}/"), target


def test_acknowledging_needs_the_csrf_token(admin: Harness) -> None:
    sandbox_signed_patch(admin, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    check(admin)
    client = admin.client
    shown = page(admin, client)
    ids = _INCIDENT.findall(shown)
    refused = client.post(f"{ADMIN}/settings-incidents/acknowledge", data={"incident": ids})
    assert refused.status_code == 400
    assert len(open_incidents(admin)) == 1


def test_a_missing_incidents_table_shows_no_banner_and_breaks_no_page(admin: Harness) -> None:
    with admin.shop.app_context():  # an upgrade whose migration has not run yet
        session = get_state().session
        session.execute(text("DROP TABLE gateway_settings_incidents"))
        session.commit()
    for url in PAGES:
        assert "data-drift-banner" not in page(admin, admin.client, url)
