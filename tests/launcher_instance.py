"""The run launcher of the launcher tests' instance: onceflow's, named from a module of the tests' own.

A standby imports the modules of its instance's classes, and stands down once one of them changed on disk. Touching
this file makes only these tests' standbys stale, not those of the other tests running beside them.
"""

from onceflow.orchestration.run_launcher import WarmRunLauncher


class TestsWarmRunLauncher(WarmRunLauncher):
    """`WarmRunLauncher`, unchanged."""
