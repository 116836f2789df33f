"""`python cli.py ...` from a checkout runs the `pareto` command; the tree lives in pareto/_cli/cli.py."""

from __future__ import annotations

import sys

from pareto._cli.cli import cli, main

__all__ = ["cli", "main"]

if __name__ == "__main__":
    sys.exit(main())
