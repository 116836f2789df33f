"""The tree's layout rules (CONTRIBUTING.md, "Where things go"), checked the way a reviewer would."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click

from pareto._cli.cli import cli, subcommands
from pareto.store.records import TrialState

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
    for name, command in subcommands(group).items():
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


# --- the layers: which part of pareto may import which --------------------------------------------------

#: pareto's parts, lowest first: a module imports its own part and the parts below it, never one above
#: (the test below checks every import, at module top, inside functions and for type checking alike).
#: Each part's modules, as dotted prefixes.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("pareto.errors", "pareto._version", "pareto.units", "pareto.naming", "pareto.metrics", "pareto.slo",
              "pareto.machine", "pareto.signals")),
    ("rules", ("pareto.front", "pareto.limits", "pareto.explanation")),
    ("runtime", ("pareto.task", "pareto.tasks", "pareto.devices", "pareto.locks")),
    ("store", ("pareto.store",)),
    ("measure", ("pareto.measure",)),
    ("compress", ("pareto.compress",)),
    ("spec", ("pareto.spec",)),
    ("study", ("pareto.study",)),
    ("nightly job", ("pareto.nightly_job",)),
    ("api", ("pareto.api",)),
    ("outputs", ("pareto.report", "pareto.export")),
    ("entry points", ("pareto.serve", "pareto._cli", "pareto.__main__")),
)  # fmt: skip
#: Third-party packages a module imports inside the function that needs them rather than at its top
#: (and so do the pareto modules that import them at their top): the read commands (``best``,
#: ``frontier``, the server) never load torch, Optuna, NumPy or SciPy, and ONNX Runtime, torchao,
#: Transformers, FastAPI and uvicorn are optional extras; the spec's pydantic models take a tenth of a
#: second to build, which a read (``pareto best``: Python's start and the database driver's) does not need.
HEAVY = {"torch", "optuna", "numpy", "scipy", "onnxruntime", "onnx", "torchao", "transformers", "sklearn", "fastapi",
         "uvicorn", "starlette", "pydantic"}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    if module == "pareto":  # the package's __init__: the public API
        return len(LAYERS) - 1
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no part of LAYERS: add it to one (and to CONTRIBUTING's map)")


def _imports() -> dict[str, list[tuple[str, str, int]]]:
    """Each pareto module's imports: (imported module or package, "top" | "inner" | "typing", line)."""
    modules = {_module_name(p): p for p in _sources() if p.is_relative_to(ROOT / "pareto")}
    found: dict[str, list[tuple[str, str, int]]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found[name] = []
        _walk_imports(ast.parse(path.read_text()), "top", package, modules, found[name])
    return found


def _walk_imports(node: ast.AST, where: str, package: str, modules: dict[str, Path], out: list) -> None:
    for child in ast.iter_child_nodes(node):
        here = where
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and where == "top":
            here = "inner"
        elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            here = "typing"
        if isinstance(child, ast.Import):
            out += [(a.name, here, child.lineno) for a in child.names]
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else [])
                )
            for alias in child.names:  # `from pareto.study import search` imports the module pareto.study.search
                full = f"{base}.{alias.name}"
                out.append((full if full in modules else base, here, child.lineno))
        _walk_imports(child, here, package, modules, out)


def _pareto_target(name: str, modules: set[str]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _loaded(module: str) -> list[str]:
    """What importing ``module`` runs: its packages' ``__init__`` modules, then itself."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def _heavy_modules(imports: dict[str, list[tuple[str, str, int]]]) -> set[str]:
    """The pareto modules whose import loads a HEAVY package (directly, through the modules they import
    at their top, or through their packages' ``__init__``)."""
    heavy = {m for m, found in imports.items() if any(n.split(".")[0] in HEAVY for n, w, _ in found if w == "top")}
    changed = True
    while changed:
        changed = False
        for module, found in imports.items():
            targets = {_pareto_target(n, set(imports)) for n, w, _ in found if w == "top"}
            loads = {m for t in targets if t for m in _loaded(t)} | set(_loaded(module))
            if module not in heavy and loads & heavy:
                heavy.add(module)
                changed = True
    return heavy


def test_each_part_imports_only_the_parts_below_it() -> None:
    imports = _imports()
    upward = []
    for module, found in imports.items():
        for name, where, line in found:
            target = _pareto_target(name, set(imports)) if name.startswith("pareto") else None
            if target and _layer(target) > _layer(module):
                upward.append(f"{module}:{line} imports {target} ({where})")
    assert not upward, f"imports from a lower part to a higher one (LAYERS): {upward}"


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over every import between pareto's modules."""
    imports = _imports()
    graph = {
        m: {t for n, _, _ in found if (t := _pareto_target(n, set(imports))) and t != m} for m, found in imports.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_inside_functions_only_defer_heavy_modules() -> None:
    """A pareto module is imported at the top of the module that needs it, unless importing it loads a
    HEAVY package (torch, Optuna, NumPy, SciPy, an optional extra): then where it is used."""
    imports = _imports()
    heavy = _heavy_modules(imports)
    needless = []
    for module, found in imports.items():
        for name, where, line in found:
            target = _pareto_target(name, set(imports)) if name.startswith("pareto") else None
            if where == "inner" and target and target not in heavy:
                needless.append(f"{module}:{line} {target}")
    assert not needless, f"imports inside functions of modules that load nothing heavy: {needless}"


def test_no_public_function_shadows_a_module() -> None:
    """``import pareto.front`` is the module; ``pareto.frontier`` the function: no name of the public API
    (``pareto.__all__``) is also a module or package of pareto."""
    import pareto

    modules = {p.stem for p in (ROOT / "pareto").glob("*.py")} | {
        p.name for p in (ROOT / "pareto").iterdir() if p.is_dir()
    }
    assert set(pareto.__all__) & modules == set()
    assert pareto.__version__ == __import__("pareto._version").__version__


def test_contributings_map_matches_the_tree() -> None:
    """CONTRIBUTING's map has LAYERS' parts in order, names only paths that exist, and covers every
    module at the top of pareto/ and every package in it."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| part")]
    assert [row.split("|")[1].strip() for row in rows] == [name for name, _ in LAYERS]
    named = set(re.findall(r"`(pareto/[\w/.]*)`", section))
    assert {p for p in named if not (ROOT / p).exists()} == set()
    tree = {f"pareto/{p.name}" for p in (ROOT / "pareto").glob("*.py")}
    tree |= {f"pareto/{p.name}/" for p in (ROOT / "pareto").iterdir() if (p / "__init__.py").exists()}
    assert tree - named == set()
    for name, prefixes in LAYERS:  # each part's row names its modules
        row = next(r for r in rows if r.split("|")[1].strip() == name)
        for prefix in prefixes:
            path = prefix.replace(".", "/")
            assert f"`{path}.py`" in row or f"`{path}/`" in row, f"{prefix} is not in the map's {name!r} row"


# --- the store's boundary ------------------------------------------------------------------------------

#: The store's boundary: what no module outside ``pareto/store/`` imports or calls.
SESSION_NAMES = {"session_scope", "Session", "sessionmaker"}
SESSION_CALLS = {"add", "execute", "scalar", "scalars"}
STATES = {state.value for state in TrialState}


def boundary_breaches(name: str, source: str) -> list[str]:
    """What in one module outside the store crosses its boundary."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module == "pareto.store.models" or (
                module == "pareto.store" and any(a.name == "models" for a in node.names)
            ):
                found.append(f"{name}:{node.lineno} imports pareto.store.models")
            found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name in SESSION_NAMES]
        elif isinstance(node, ast.Import):
            found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names if a.name == "pareto.store.models"]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in {"session", "s"}
            and node.func.attr in SESSION_CALLS
        ):
            found.append(f"{name}:{node.lineno} {node.func.value.id}.{node.func.attr}(")
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops
        ):
            for part in [node.left, *node.comparators]:
                constants = part.elts if isinstance(part, ast.Tuple | ast.List | ast.Set) else [part]
                found += [
                    f"{name}:{node.lineno} compares with {c.value!r}"
                    for c in constants
                    if isinstance(c, ast.Constant) and c.value in STATES
                ]
    return found


def test_no_session_row_or_state_string_outside_the_store() -> None:
    """Outside ``pareto/store/`` callers read frozen records and write through the store's functions
    (``storage``, ``reading``, ``writing``); a trial's state is ``TrialState``."""
    breaches = []
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith("pareto/store/"):
            breaches += boundary_breaches(name, path.read_text())
    assert not breaches, f"the store's boundary crossed: {breaches}"


def test_the_check_sees_each_kind_of_breach() -> None:
    source = (
        "from pareto.store.engine import session_scope\n"
        "from pareto.store.models import Trial\n"
        "from sqlalchemy.orm import Session\n"
        "with session_scope(e) as session:\n"
        "    session.add(row)\n"
        "    s.execute(q)\n"
        "ok = row.state == 'COMPLETE' or state in ('BUSY', 'x')\n"
    )
    found = boundary_breaches("m.py", source)
    assert len(found) == 7, found
