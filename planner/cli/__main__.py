"""``python -m planner.cli``: the ``plan`` command."""

import sys

from planner.cli.main import main

sys.exit(main())
