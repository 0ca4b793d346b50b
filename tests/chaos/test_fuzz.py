"""Property-based fuzzing of what producers send (hypothesis): whatever the body and attributes, every record ends
up exactly once, as a raw row or as a dead-letter row with a reason, and no batch fails because of a record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from onceflow.resources.emulators.pubsub import PubSubEmulator
from tests.delta_reader import read_rows
from tests.pipelines import TOPIC, drain, events_pipeline, new_project, setup

NOW_MS = 1_795_000_000_000
REASONS = {"oversized", "not_json", "missing_field", "wrong_type", "out_of_range", "missing_event_time",
           "bad_event_time", "event_time_out_of_range", "beyond_dedup_horizon"}

json_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
values = st.one_of(
    st.integers(min_value=-10**40, max_value=10**40), st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=False, allow_infinity=False, places=12), st.text(max_size=10), json_junk,
)
keys = st.one_of(st.text(min_size=1, max_size=12), json_junk)
bodies = st.one_of(
    st.fixed_dictionaries({"key": keys, "value": values}),
    st.fixed_dictionaries({"key": keys}),
    st.fixed_dictionaries({"value": values}),
    st.dictionaries(st.text(max_size=5), json_junk, max_size=4),
    json_junk,
)
times = st.one_of(
    st.integers(min_value=NOW_MS - 10**11, max_value=NOW_MS + 10**11).map(str),  # far past and far future
    st.sampled_from(["2026-11-21T10:13:20Z", "2199-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "yesterday", ""]),
    st.none(),
)


def encode(body: object) -> bytes:
    # NaN and Infinity are not JSON; producers still send them, and so does this.
    return json.dumps(body, default=str, allow_nan=True).encode()


@st.composite
def messages(draw: st.DrawFn) -> list[tuple[bytes, dict[str, str]]]:
    count = draw(st.integers(min_value=20, max_value=60))
    out = []
    for i in range(count):
        kind = draw(st.sampled_from(["json", "json", "json", "raw", "empty"]))
        if kind == "json":
            data = encode(draw(bodies))
        elif kind == "raw":
            data = draw(st.binary(max_size=40))  # not UTF-8, not JSON, or both
        else:
            data = b""
        attributes = {"event_id": f"f{i}"}
        event_time = draw(times)
        if event_time is not None:
            attributes["event_time"] = event_time
        out.append((data, attributes))
        if draw(st.integers(0, 9)) == 0:
            out.append((data, attributes))  # a publisher retry: the same record again
    return out


@pytest.mark.longest
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=messages())
def test_every_fuzzed_record_is_one_raw_row_or_one_dead_letter(
    spark: SparkSession, pubsub_emulator: PubSubEmulator, tmp_path_factory, batch
) -> None:
    home = Path(tmp_path_factory.mktemp("fuzz"))
    client, source = setup(new_project(), str(home), events_pipeline(max_messages=25))
    huge = (json.dumps({"key": "k", "value": 1, "pad": "x" * (9 * 1024 * 1024)}).encode(),
            {"event_id": "huge", "event_time": str(NOW_MS)})  # near Pub/Sub's largest message
    client.publish(TOPIC, batch)
    client.publish(TOPIC, [huge])

    results = drain(lambda: spark, source, redelivery_wait_s=3)  # raises if any batch failed; a slow first pull waits

    raw = [r[0] for r in read_rows(source.raw_path, ["record_id"])]
    dead = read_rows(source.dead_letter_path, ["record_id", "reason", "detail"])
    ids = {a["event_id"] for _, a in batch} | {"huge"}
    assert len(raw) == len(set(raw)) and len({d[0] for d in dead}) == len(dead)  # nothing twice
    assert set(raw) | {d[0] for d in dead} == ids  # nothing lost
    assert {d[1] for d in dead} <= REASONS and all(d[2] for d in dead)  # every dead letter says why
    assert ("huge", "oversized") in {(d[0], d[1]) for d in dead}
    assert sum(r.received for r in results) == len(batch) + 1 and all(r.balances() for r in results)
    for record_id, value in read_rows(source.raw_path, ["record_id", "value"]):
        assert value is not None and math.isfinite(float(value)), record_id
