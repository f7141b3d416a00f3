"""``python -m gateway`` is the ``respgate`` command (gateway/ops/cli.py)."""

import sys

from gateway.ops.cli import main

sys.exit(main())
