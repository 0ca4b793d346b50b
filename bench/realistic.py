"""A clickstream written the way producers write it: the `realistic` data set of `make bench` (issue 26).

Seeded, so every run writes the same files. Beside its valid events (six hours of event time, in order but for a
minute of jitter), the files hold what real producers send:

- nested objects with optional fields (`device`), arrays of objects (`items`), optional strings sometimes absent
  and sometimes null, a field no schema declares (`sdk`);
- decimals as strings, and some as JSON numbers; some user ids as numbers for a STRING field;
- event times as ISO-8601 strings in the formats of `TIME_FORMATS`, all of which onceflow's event-time parser
  (`onceflow.jobs.ingest.validation.parse_time`) and Spark's JSON reader read to the same instant;
- `RETRY_FRACTION` publisher retries (the same record again, a few hundred lines later), `REDELIVERY_FRACTION`
  redeliveries of records from the first quarter of the files in the last quarter (a producer replay), and a
  steady `MALFORMED_FRACTION` of malformed lines (`MALFORMED`: each with the reason onceflow dead-letters it for).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench.datasets import RETRY_FRACTION, SPAN_MS, START_MS, Dataset, Written, write_in_order

SCHEMA = (
    "user_id STRING NOT NULL, action STRING NOT NULL, page STRING, referrer STRING, amount DECIMAL(18, 2), "
    "currency STRING, device STRUCT<os: STRING, version: STRING, screen_width: INT>, "
    "items ARRAY<STRUCT<sku: STRING, qty: INT, price: DECIMAL(18, 2)>>"
)
ID_FIELD, TIME_FIELD = "event_id", "event_time"
JITTER_MS = 60_000
RETRY_DISTANCE = 500  # lines: a publisher retries soon after its first try
REDELIVERY_FRACTION = 0.01
MALFORMED_FRACTION = 0.005
ACTIONS = (("view", 60), ("click", 25), ("add_to_cart", 10), ("purchase", 5))
_OFFSETS = (timezone(timedelta(hours=2)), timezone(timedelta(hours=-5)), timezone(timedelta(hours=5, minutes=30)))


def _zulu(moment: datetime, _: random.Random) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _zulu_millis(moment: datetime, _: random.Random) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _offset_millis(moment: datetime, rng: random.Random) -> str:
    return moment.astimezone(rng.choice(_OFFSETS)).isoformat(timespec="milliseconds")


def _utc_micros(moment: datetime, _: random.Random) -> str:
    return moment.isoformat(timespec="microseconds")


TIME_FORMATS: tuple[Callable[[datetime, random.Random], str], ...] = (_zulu, _zulu_millis, _offset_millis, _utc_micros)
"""`2025-11-21T10:13:20Z`, `2025-11-21T10:13:20.123Z`, `2025-11-21T12:13:20.123+02:00`,
`2025-11-21T10:13:20.123000+00:00`."""


def _truncated(record: dict[str, Any], rng: random.Random) -> str:
    text = json.dumps(record)
    return text[: rng.randrange(len(text) // 3, len(text) - 2)]


def _spoiled(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any], random.Random], str]:
    def spoil(record: dict[str, Any], _: random.Random) -> str:
        change(record)
        return json.dumps(record)

    return spoil


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.update(values)


def _drop(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.pop(name, None)


def _word_for_qty(record: dict[str, Any]) -> None:
    record["items"][0]["qty"] = "two"


MALFORMED: tuple[tuple[str, str, Callable[[dict[str, Any], random.Random], str]], ...] = (
    ("truncated line", "not_json", _truncated),
    ("a word for a decimal", "wrong_type", _spoiled(_set(amount="n/a"))),
    ("a word for an INT in an array", "wrong_type", _spoiled(_word_for_qty)),
    ("three places for DECIMAL(18, 2)", "out_of_range", _spoiled(_set(amount="19.999"))),
    ("user id missing", "missing_field", _spoiled(_drop("user_id"))),
    ("a time in no ISO-8601 format", "bad_event_time", _spoiled(_set(event_time="21/11/2025 10:13"))),
    ("event time missing", "missing_event_time", _spoiled(_drop(TIME_FIELD))),
)
"""(what the producer did, the reason onceflow dead-letters it for, how the line is spoiled)."""


def _money(cents: int, rng: random.Random, as_string: float) -> str | float:
    text = f"{cents // 100}.{cents % 100:02d}"
    return text if rng.random() < as_string else float(text)  # a float's repr keeps the two places exactly


def _maybe(record: dict[str, Any], name: str, value: Any, rng: random.Random, absent: float, null: float) -> None:
    draw = rng.random()
    if draw >= absent:
        record[name] = None if draw < absent + null else value


def event(moment: datetime, rng: random.Random, purchase: bool = False) -> dict[str, Any]:
    """One event as its producer sends it (a purchase, with `purchase`)."""
    action = "purchase" if purchase else rng.choices([a for a, _ in ACTIONS], [w for _, w in ACTIONS])[0]
    user = rng.randrange(1, 50_000)
    record: dict[str, Any] = {
        ID_FIELD: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        TIME_FIELD: rng.choice(TIME_FORMATS)(moment, rng),
        "user_id": user if rng.random() < 0.15 else f"u{user}",
        "action": action,
        "sdk": rng.choice(("web/3.2.1", "ios/7.0.4", "android/7.1.0")),
    }
    _maybe(record, "page", f"/p/{rng.randrange(2_000)}", rng, absent=0.10, null=0.05)
    _maybe(record, "referrer", rng.choice(("google.com", "news.example", "mail")), rng, absent=0.50, null=0.10)
    device: dict[str, Any] = {"os": rng.choice(("ios", "android", "linux", "windows"))}
    _maybe(device, "version", f"{rng.randrange(10, 18)}.{rng.randrange(10)}", rng, absent=0.20, null=0.05)
    _maybe(device, "screen_width", rng.choice((390, 412, 1280, 1920)), rng, absent=0.10, null=0.0)
    _maybe(record, "device", device, rng, absent=0.10, null=0.02)
    if action in ("add_to_cart", "purchase"):
        items = [{"sku": f"sku-{rng.randrange(5_000)}", "qty": rng.randrange(1, 4),
                  "price": rng.randrange(99, 20_000)} for _ in range(rng.randrange(1, 5))]
        record["amount"] = _money(sum(it["qty"] * it["price"] for it in items), rng, as_string=0.8)
        record["currency"] = rng.choice(("EUR", "USD"))
        for item in items:
            item["price"] = _money(item["price"], rng, as_string=0.7)
        record["items"] = items
    else:
        _maybe(record, "items", [], rng, absent=0.7, null=0.1)
    return record


def write(directory: Path, events: int, files: int, seed: int = 26) -> Written:
    """Write the clickstream of `events` distinct valid events as `files` JSON-lines files."""
    rng = random.Random(seed)
    step = SPAN_MS / events
    keyed: list[tuple[float, str]] = []
    for i in range(events):
        moment = datetime.fromtimestamp((START_MS + i * step + rng.uniform(-JITTER_MS, JITTER_MS)) / 1000, UTC)
        keyed.append((i, json.dumps(event(moment, rng))))
    originals = list(keyed)
    retries = rng.sample(originals, int(events * RETRY_FRACTION))
    keyed += [(i + rng.randrange(1, RETRY_DISTANCE) + 0.5, line) for i, line in retries]
    quarter = originals[: max(1, events // 4)]
    redeliveries = [rng.choice(quarter) for _ in range(int(events * REDELIVERY_FRACTION))]
    keyed += [(rng.uniform(0.75 * events, events), line) for _, line in redeliveries]
    malformed = round(len(keyed) * MALFORMED_FRACTION / (1 - MALFORMED_FRACTION))
    dead_letters: dict[str, int] = {}
    for k in range(malformed):
        position = (k + 0.5) * events / malformed  # steady: evenly through the files
        _, reason, spoil = MALFORMED[k % len(MALFORMED)]
        moment = datetime.fromtimestamp((START_MS + position * step) / 1000, UTC)
        keyed.append((position + 0.25, spoil(event(moment, rng, purchase=True), rng)))
        dead_letters[reason] = dead_letters.get(reason, 0) + 1
    write_in_order(directory, keyed, files)
    return Written(len(keyed), events, dead_letters, {"retries": len(retries), "redeliveries": len(redeliveries)})


REALISTIC = Dataset(
    name="realistic", pipeline_name="clickstream", schema=SCHEMA, id_field=ID_FIELD, time_field=TIME_FIELD,
    time_as_millis=False, default_events=300_000, generate=write,
    description=f"clickstream: nested and optional fields, decimals and ISO-8601 times as strings, "
    f"{RETRY_FRACTION:.0%} retries, {REDELIVERY_FRACTION:.0%} redeliveries, {MALFORMED_FRACTION:.1%} malformed lines",
)
