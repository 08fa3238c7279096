"""Times as people read them (``flask_gateway.core.local_time``): one format, one zone, months added."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from flask_gateway.core.local_time import add_months, format_date, format_time

JOHANNESBURG = ZoneInfo("Africa/Johannesburg")


@pytest.mark.parametrize(
    ("start", "months", "expected"),
    [
        (datetime(2026, 12, 1, 19, 12, tzinfo=UTC), 1, datetime(2027, 1, 1, 19, 12, tzinfo=UTC)),
        (datetime(2026, 12, 1, 19, 12, tzinfo=UTC), 2, datetime(2027, 2, 1, 19, 12, tzinfo=UTC)),
        (datetime(2027, 1, 31, 8, 0, tzinfo=UTC), 1, datetime(2027, 2, 28, 8, 0, tzinfo=UTC)),
        (datetime(2028, 1, 31, 8, 0, tzinfo=UTC), 1, datetime(2028, 2, 29, 8, 0, tzinfo=UTC)),
        (datetime(2027, 3, 31, 8, 0, tzinfo=UTC), 1, datetime(2027, 4, 30, 8, 0, tzinfo=UTC)),
        (datetime(2027, 5, 15, 8, 0, tzinfo=UTC), 0, datetime(2027, 5, 15, 8, 0, tzinfo=UTC)),
        (datetime(2027, 11, 30, 8, 0, tzinfo=UTC), 14, datetime(2029, 1, 30, 8, 0, tzinfo=UTC)),
    ],
)
def test_add_months_keeps_the_day_or_takes_the_months_last(start, months, expected):
    assert add_months(start, months) == expected


def test_a_time_and_a_date_in_the_zone_the_reader_lives_in():
    late = datetime(2026, 12, 1, 22, 30, tzinfo=UTC)  # already 2 December in Johannesburg
    assert format_time(late, JOHANNESBURG, seconds=False) == "2026-12-02 00:30 SAST"
    assert format_date(late, JOHANNESBURG) == "2026-12-02"
    assert format_date(late, ZoneInfo("UTC")) == "2026-12-01"
    assert format_time(late.replace(tzinfo=None), ZoneInfo("UTC")) == "2026-12-01 22:30:00 UTC"  # naive: UTC
    assert format_time(late, ZoneInfo("Asia/Tehran"), seconds=False).endswith("UTC+0330")
    assert format_time(None, JOHANNESBURG) == "-"
