"""``python -m benchmarks.gpu_truth``."""

import sys

from benchmarks.gpu_truth.cli import main

sys.exit(main())
