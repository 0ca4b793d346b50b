"""`python -m onceflow`: the `onceflow` command line."""

import sys

from onceflow.orchestration.cli.main import main

sys.exit(main())
