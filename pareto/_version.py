"""pareto's version, in a module of its own so that any part of the package can read it without
importing the public API (``pareto/__init__.py``) and everything it imports."""

__version__ = "0.1.0"
