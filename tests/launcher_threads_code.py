"""A code location whose definitions start a thread when loaded, as some client libraries do: a forked run must
load them in its own process (threads do not survive a fork), so its op finds the thread alive."""

import threading

import dagster as dg

HEARTBEAT = "client-heartbeat"
threading.Thread(target=threading.Event().wait, name=HEARTBEAT, daemon=True).start()


@dg.op
def heartbeat_alive() -> None:
    if not any(thread.name == HEARTBEAT and thread.is_alive() for thread in threading.enumerate()):
        raise RuntimeError("the definitions' thread is not running in the run's process")


@dg.job
def quick() -> None:
    heartbeat_alive()


defs = dg.Definitions(jobs=[quick])
