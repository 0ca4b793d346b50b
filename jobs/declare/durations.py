"""Durations as pipelines declare them (`"30s"`, `"5m"`, `"1h"`, `"1d"`), and the window sizes onceflow offers."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^([0-9]+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MINUTE, HOUR, DAY = 60, 3600, 86400


def parse_duration(text: str) -> int:
    """`"30s"` → 30 (seconds). Raises `ValueError` for anything but a whole number and one unit of s, m, h, d."""
    match = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a duration: write a whole number and a unit, e.g. '30s', '5m', '1h', '1d'")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


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
