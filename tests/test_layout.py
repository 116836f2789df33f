"""The tree's layout rules (CONTRIBUTING.md, "Where things go"), checked the way a reviewer would."""

from __future__ import annotations

import ast
from pathlib import Path

import click

from pareto._cli.cli import cli

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 800
MAX_BODY_LINES = 60
#: SQLAlchemy's statement constructors: SQL is written in pareto/store/ (and the advisory locks) only
STATEMENTS = {"select", "insert", "update", "delete", "text"}


def _sources() -> list[Path]:
    files = [p for p in (ROOT / "pareto").rglob("*.py") if not p.is_symlink()]
    return sorted([*files, ROOT / "cli.py"])


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """From the first statement after the docstring to the end."""
    body = node.body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    first = body[1] if docstring and len(body) > 1 else body[0]
    return (node.end_lineno or first.lineno) - first.lineno + 1


def test_modules_and_function_bodies_stay_small() -> None:
    too_long = []
    for path in _sources():
        source = path.read_text()
        name = path.relative_to(ROOT)
        if source.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _body_lines(node) > MAX_BODY_LINES:
                too_long.append(f"{name}:{node.lineno} {node.name}: a {_body_lines(node)}-line body")
    assert not too_long, f"over {MAX_MODULE_LINES} lines a module or {MAX_BODY_LINES} a body: {too_long}"


def test_sql_statements_only_in_the_store() -> None:
    outside = []
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("pareto/store/") or name == "pareto/locks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                outside += [f"{name}:{node.lineno} {a.name}" for a in node.names if a.name in STATEMENTS]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"sqlalchemy", "sa"}
                and node.attr in STATEMENTS
            ):
                outside.append(f"{name}:{node.lineno} sqlalchemy.{node.attr}")
    assert not outside, f"SQL statements outside pareto/store/ and pareto/locks.py: {outside}"


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append((prefix + name, command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix}{name} ")
    return found


def test_every_command_lives_in_its_own_module() -> None:
    """cli.py holds the group and main; ``pareto NAME`` (and its subcommands) in pareto/_cli/NAME.py."""
    commands = _commands(cli)
    assert {name for name, _ in commands} >= {"search", "best", "frontier", "studies create", "db upgrade"}
    for name, command in commands:
        assert command.callback is not None
        module = command.callback.__module__
        assert module == f"pareto._cli.{name.split()[0]}", f"`pareto {name}` is defined in {module}"
