"""The installed home of the command tree.

The click tree is the repository's top-level ``cli.py``; ``pareto/_cli/cli.py`` is a symbolic link to
it, so a wheel carries it as ``pareto._cli.cli`` and installs no top-level module named ``cli``
(which would collide with any other distribution that ships one).
"""
