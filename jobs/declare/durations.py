"""Durations as pipelines declare them (`"30s"`, `"5m"`, `"5 minutes"`, `"1h"`, `"1d"`, or a `timedelta` of whole
seconds), and the window sizes onceflow offers."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "s": ("s", "sec", "secs", "second", "seconds"),
    "m": ("m", "min", "mins", "minute", "minutes"),
    "h": ("h", "hr", "hrs", "hour", "hours"),
    "d": ("d", "day", "days"),
}
_UNIT_OF = {spelling: unit for unit, spellings in _UNITS.items() for spelling in spellings}
_DURATION = re.compile(r"^([0-9]+) ?([a-z]+)$")
_SHORT = re.compile(r"^[0-9]+[smhd]$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MINUTE, HOUR, DAY = 60, 3600, 86400

Duration = str | timedelta


def parse_duration(value: Duration) -> int:
    """`"30s"`, `"30 seconds"` or `timedelta(seconds=30)` → 30 (seconds). Raises `ValueError` for anything but a
    whole number and one unit of seconds, minutes, hours or days (or a `timedelta` of whole, positive seconds)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if seconds < 0 or seconds != int(seconds):
            raise ValueError(f"{value!r} is not a duration: a timedelta of whole seconds, not negative")
        return int(seconds)
    match = _DURATION.match(value.strip().lower()) if isinstance(value, str) else None
    if match is None or match.group(2) not in _UNIT_OF:
        raise ValueError(f"{value!r} is not a duration: write a whole number and a unit, e.g. '30s', '5m', "
                         "'5 minutes', '1h', '1d', or give a timedelta")
    return int(match.group(1)) * _UNIT_S[_UNIT_OF[match.group(2)]]


def normal_duration(value: object) -> object:
    """`value` in the short spelling (`timedelta(minutes=5)` and `"5 minutes"` → `"5m"`; `"300s"` stays), so that
    stored declarations and their comparisons see one form; a value that is not a duration is returned as it is,
    for the declaration's checks to name."""
    if isinstance(value, str) and _SHORT.match(value):
        return value
    try:
        return render_duration(parse_duration(value))  # type: ignore[arg-type]
    except ValueError:
        return value


def check_window_size(seconds: int) -> int:
    """Return `seconds` if it is a window size: one minute to one day, dividing the next larger unit."""
    if MINUTE <= seconds < HOUR and seconds % MINUTE == 0 and HOUR % seconds == 0:
        return seconds
    if HOUR <= seconds < DAY and seconds % HOUR == 0 and DAY % seconds == 0:
        return seconds
    if seconds == DAY:
        return seconds
    raise ValueError(
        f"{seconds}s is not a window size: windows are 1m to 1d, in minutes that divide an hour "
        "(1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) or hours that divide a day (1, 2, 3, 4, 6, 8, 12, 24)"
    )


def window_cron(seconds: int) -> str:
    """The cron schedule whose ticks are the starts of `seconds`-long windows (UTC)."""
    if seconds < HOUR:
        minutes = seconds // MINUTE
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if seconds < DAY:
        hours = seconds // HOUR
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    return "0 0 * * *"


def render_duration(seconds: int) -> str:
    """The shortest exact spelling: 3600 → `"1h"`, 90 → `"90s"`."""
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNIT_S[unit] == 0:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    return f"{seconds}s"
