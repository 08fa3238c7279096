"""``EMULATOR_*`` variables read into :class:`EmulatorSettings`: the accounts' names and the pages' zone."""

from __future__ import annotations

import pytest

from flask_gateway.emulator import EmulatorSettings
from flask_gateway.emulator.settings import SettingsError


def test_an_account_may_carry_the_name_its_payment_page_is_headed_with():
    settings = EmulatorSettings.from_env(
        {"EMULATOR_ACCOUNTS": "demo-merchant:demo-api-key:Stoep Homeware, brand-b:brand-b-key"}
    )
    assert settings.accounts == {"demo-merchant": "demo-api-key", "brand-b": "brand-b-key"}
    assert settings.account_names == {"demo-merchant": "Stoep Homeware"}
    assert settings.account_name("demo-merchant") == "Stoep Homeware"
    assert settings.account_name("brand-b") == "brand-b"  # no name: its id


def test_a_name_may_hold_colons_but_an_entry_needs_an_id_and_a_key():
    settings = EmulatorSettings.from_env({"EMULATOR_ACCOUNTS": "1:key-1:Stoep: home and garden"})
    assert settings.account_names == {"1": "Stoep: home and garden"}
    for broken in ("1", "1:", ":key", "1::Name"):
        with pytest.raises(SettingsError, match="is not 'id:apikey' or 'id:apikey:Name'"):
            EmulatorSettings.from_env({"EMULATOR_ACCOUNTS": broken})


def test_the_pages_zone_is_an_iana_name_utc_by_default():
    assert EmulatorSettings.from_env({}).timezone == "UTC"
    chosen = EmulatorSettings.from_env({"EMULATOR_TIMEZONE": "Africa/Johannesburg"})
    assert chosen.zone.key == "Africa/Johannesburg"
    for wrong in ("SAST", "Africa/Joburg", "../etc/passwd"):
        with pytest.raises(SettingsError, match=r"EMULATOR_TIMEZONE=.* is not an IANA time zone name"):
            EmulatorSettings.from_env({"EMULATOR_TIMEZONE": wrong})
