"""The local servers onceflow starts (emulators, Spark Connect, dagster dev): whether they listen, and stopping them,
children included."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence

import psutil


def stop_process_group(
    process: subprocess.Popen[bytes],
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGKILL),
    timeout_s: float = 15.0,
) -> None:
    """Signal the process group `process` leads (started with `start_new_session=True`) until it exits.

    Each signal in turn gets `timeout_s` to work; signalling the group, not the process, reaches the children a
    wrapper script or supervisor starts. Idempotent: a group that is gone already is left alone.
    """
    for sig in signals:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_tree(pid: int, sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Signal `pid` and every process below it, children first listed at once (so none escapes by re-parenting);
    returns the pids signalled. A process already gone is skipped."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    signalled = []
    for process in tree:
        try:
            process.send_signal(sig)
            signalled.append(process.pid)
        except psutil.NoSuchProcess:
            continue
    return signalled


def listens(process: subprocess.Popen[bytes], port: int) -> bool:
    """Whether `process`, or a process below it, listens on TCP `port`: that something answers there is not enough,
    as another process may hold a port this one was told to take (a port chosen free can be taken again before it
    binds, by a server another process starts)."""
    try:
        root = psutil.Process(process.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for member in tree:
        try:
            held = member.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in held):
            return True
    return False
