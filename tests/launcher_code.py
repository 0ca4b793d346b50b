"""A small code location for the run launcher's tests: a job that ends at once and one that waits to be cancelled."""

import time

import dagster as dg


@dg.op
def nothing() -> None:
    """Ends at once."""


@dg.op
def wait_long() -> None:
    time.sleep(300)


@dg.job
def quick() -> None:
    nothing()


@dg.job
def waits() -> None:
    wait_long()


defs = dg.Definitions(jobs=[quick, waits])
