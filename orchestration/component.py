"""`OnceflowPipelines`: onceflow as a Dagster component, so a `dg` project adds its pipelines from `defs/` YAML.

    # src/my_project/defs/onceflow/defs.yaml
    type: onceflow.OnceflowPipelines
    attributes:
      pipelines_module: my_project.onceflow_pipelines   # defines PIPELINES, a list of onceflow.Pipeline
      deployment: prod                                   # optional: else ONCEFLOW_DEPLOYMENT, else local

It builds what `onceflow.definitions(PIPELINES)` builds: every job, asset, check, sensor and schedule of the
pipelines, and the resources of the deployment. The runtime knobs still come from the `ONCEFLOW_*` variables.
One component per project: its sensors and jobs (`commit_sensor`, `finalize_commits`, ...) exist once per code
location, so every pipeline goes in the one module's `PIPELINES`. The distribution registers the component with
`dg` (the `dagster_dg_cli.registry_modules` entry point), so `dg list components` shows it.
"""

from __future__ import annotations

from typing import Literal

import dagster as dg
from pydantic import Field

from onceflow.orchestration.definitions import definitions
from onceflow.orchestration.pipelines import pipelines_in_module
from onceflow.resources.settings import load_settings


class OnceflowPipelines(dg.Component, dg.Resolvable, dg.Model):
    """onceflow's pipelines of one module: their ingest jobs, window assets and checks, sensors and schedules."""

    pipelines_module: str = Field(description="`package.module` defining PIPELINES, a list of onceflow.Pipeline.")
    deployment: Literal["local", "prod"] | None = Field(
        default=None, description="Which resources the pipelines get; default: ONCEFLOW_DEPLOYMENT, else local."
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        settings = load_settings(**({"deployment": self.deployment} if self.deployment else {}))
        pipelines = pipelines_in_module(self.pipelines_module, f"pipelines_module: {self.pipelines_module!r}")
        return definitions(pipelines, settings)
