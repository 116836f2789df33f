"""``python -m pareto``: the same command tree as the ``pareto`` script."""

import sys

from pareto._cli.cli import main

sys.exit(main())
