from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_gateway.core.timestamps import (
    format_timestamp,
    format_v1_timestamp,
    parse_timestamp,
    parse_v1_timestamp,
)

#: Hypothesis fails an example that takes over 200 ms by default: a time bound, that a loaded
#: machine can break. None here.
NO_DEADLINE = settings(deadline=None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T10:00:00Z", datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)),
        ("2024-05-01T10:00:00.123Z", datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC)),
        ("2024-05-01T10:00:00.123456Z", datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2024-05-01T10:00:00.123456789Z", datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2024-05-01T10:00:00.5Z", datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2024-05-01T12:00:00+02:00", datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)),
        ("2024-05-01T12:00:00.250+0200", datetime(2024, 5, 1, 10, 0, 0, 250000, tzinfo=UTC)),
    ],
)
def test_parse_v2(text, expected):
    parsed = parse_timestamp(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    ["2024-05-01T10:00:00", "2024-05-01", "2024-05-01 10:00:00Z", "yesterday", "", "2024-13-01T00:00:00Z"],
)
def test_parse_v2_refuses_ambiguous_or_malformed(text):
    with pytest.raises(ValueError, match=r"timestamp|month"):
        parse_timestamp(text)


def test_format_precisions():
    moment = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert format_timestamp(moment) == "2024-05-01T10:00:00.123Z"
    assert format_timestamp(moment, "us") == "2024-05-01T10:00:00.123456Z"
    assert format_timestamp(moment, "s") == "2024-05-01T10:00:00Z"
    other_zone = moment.astimezone(timezone(timedelta(hours=2)))
    assert format_timestamp(other_zone) == "2024-05-01T10:00:00.123Z"


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="naive"):
        format_timestamp(datetime(2024, 5, 1))
    with pytest.raises(ValueError, match="naive"):
        format_v1_timestamp(datetime(2024, 5, 1))


def test_v1_round_trip():
    moment = parse_v1_timestamp("2024-05-01 10:11:12")
    assert moment == datetime(2024, 5, 1, 10, 11, 12, tzinfo=UTC)
    assert format_v1_timestamp(moment) == "2024-05-01 10:11:12"
    with pytest.raises(ValueError, match="v1 timestamp"):
        parse_v1_timestamp("2024-05-01T10:11:12Z")


@NO_DEADLINE
@given(st.datetimes(timezones=st.just(UTC)))
def test_microsecond_format_round_trips(moment):
    assert parse_timestamp(format_timestamp(moment, "us")) == moment
