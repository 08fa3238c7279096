"""The one clock people read (GATEWAY_TIMEZONE): stored UTC shown in the configured zone with its name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from flask_gateway import ConfigurationError
from flask_gateway.clock import format_time, local_time, zone
from flask_gateway.config import GatewayConfig


def test_a_naive_stored_time_is_utc_and_shown_in_the_zone_with_its_abbreviation():
    stored = datetime(2026, 11, 27, 11, 51, 9)  # as the database gives it back: naive UTC
    assert format_time(stored, zone("Africa/Johannesburg")) == "2026-11-27 13:51:09 SAST"
    assert format_time(stored, zone("UTC")) == "2026-11-27 11:51:09 UTC"
    assert format_time(stored, zone("Africa/Johannesburg"), seconds=False) == "2026-11-27 13:51 SAST"
    assert local_time(stored, zone("Africa/Johannesburg")).utcoffset() == timedelta(hours=2)


def test_an_aware_time_is_converted_and_summer_time_follows_the_date():
    aware = datetime(2026, 7, 1, 12, 0, tzinfo=timezone(timedelta(hours=-4)))
    assert format_time(aware, zone("Europe/Amsterdam")) == "2026-07-01 18:00:00 CEST"
    winter = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert format_time(winter, zone("Europe/Amsterdam")) == "2026-01-01 13:00:00 CET"


def test_a_zone_without_an_abbreviation_shows_its_offset_and_no_time_shows_the_empty_mark():
    stored = datetime(2026, 11, 27, 11, 51, 9)
    assert format_time(stored, zone("Asia/Dubai")) == "2026-11-27 15:51:09 UTC+0400"
    assert format_time(None, zone("UTC")) == "-"
    assert format_time(None, zone("UTC"), empty="never") == "never"


@pytest.mark.parametrize("bad", ["Mars/Olympus", "SAST", "", " UTC", "../etc/passwd", 5])
def test_the_config_refuses_a_zone_the_tz_database_does_not_know_naming_the_key(bad: object):
    with pytest.raises(ConfigurationError, match=r"^GATEWAY_TIMEZONE="):
        GatewayConfig.from_mapping({"GATEWAY_TIMEZONE": bad})


def test_the_default_is_utc_and_the_configured_zone_reaches_the_config():
    defaults: dict[str, object] = {}
    assert GatewayConfig.from_mapping(defaults).zone == zone("UTC")
    assert defaults["GATEWAY_TIMEZONE"] == "UTC"  # written back, as every default
    chosen = GatewayConfig.from_mapping({"GATEWAY_TIMEZONE": "Africa/Johannesburg"})
    assert chosen.zone == zone("Africa/Johannesburg") and chosen.timezone == "Africa/Johannesburg"


def test_the_operations_texts_people_read_use_the_configured_clock(databases, monkeypatch):
    """The callback-silence sentence (status page, log) and the doctor's schedule times are in
    GATEWAY_TIMEZONE with the zone's name, not UTC."""
    from flask_gateway.operations.doctor.schedules import _when
    from flask_gateway.operations.health import Silence, silence_text
    from tests.extension.conftest import build_harness

    harness = build_harness(databases, monkeypatch, GATEWAY_TIMEZONE="Africa/Johannesburg")
    stored = datetime(2026, 11, 27, 11, 51, 9)
    with harness.shop.app_context():
        sentence = silence_text(Silence(30, 3, stored, 7, account="acct"))
        assert "no verified callback since 2026-11-27 13:51:09 SAST" in sentence, sentence
        assert _when(stored) == "2026-11-27 13:51 SAST"
        assert _when(None) == "never"
