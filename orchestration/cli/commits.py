"""`onceflow commits`: list commit sequences that are not done, and re-arm a quarantined one."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from onceflow.jobs.publish.commit_records import SequenceState
from onceflow.jobs.publish.commit_store import CommitStore
from onceflow.resources.lake import LakeResource
from onceflow.resources.settings import load_settings


def _when(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def describe(state: SequenceState) -> str:
    done = sum(s == "done" for s in state.steps)
    line = (
        f"{state.sequence_id}  {state.status}  steps {done}/{len(state.steps)}  attempts "
        f"{state.attempts_used}/{state.max_attempts} (lineages {state.lineages})  updated {_when(state.updated_at_ms)}"
    )
    if state.quarantine_reason:
        line += f"\n    quarantined: {state.quarantine_reason}"
    elif state.last_error:
        line += f"\n    last error: {state.last_error}"
    return line


def commit_store() -> CommitStore:
    return CommitStore(LakeResource(home=load_settings().home_path).commits())


def cmd_list(_: argparse.Namespace) -> int:
    store = commit_store()
    pending, quarantined = store.unfinished(), store.quarantined()
    print(f"{len(pending)} pending, {len(quarantined)} quarantined commit sequences")
    for seq in quarantined + pending:
        print(describe(store.state(seq)))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    store = commit_store()
    try:
        state = store.rearm(args.sequence_id, args.max_attempts)
    except (KeyError, ValueError) as error:
        print(f"onceflow commits retry: {error}")
        return 1
    print(f"re-armed: {describe(state)}\ncommit_sensor will launch its next attempt.")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    commits = sub.add_parser("commits", help="commit sequences: list, retry a quarantined one")
    commands = commits.add_subparsers(dest="commits_command", required=True)
    commands.add_parser("list", help="pending and quarantined sequences").set_defaults(func=cmd_list)
    retry = commands.add_parser("retry", help="re-arm a quarantined sequence with a fresh attempt budget")
    retry.add_argument("sequence_id")
    retry.add_argument("--max-attempts", type=int, default=None, help="a new budget (default: the old one)")
    retry.set_defaults(func=cmd_retry)
