"""Storage: SQLAlchemy models, engines, migrations and the queries the commands run."""

from __future__ import annotations

from pareto.store.engine import open_engine, require_schema, resolve_url, session_scope, upgrade

__all__ = ["open_engine", "require_schema", "resolve_url", "session_scope", "upgrade"]
