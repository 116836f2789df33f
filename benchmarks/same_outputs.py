"""Same outputs: old code and new give byte-identical output on the same databases (issue 37).

What it proves, for an old git revision against the working tree:

* the read commands (best, frontier, explain, studies, history; tables and ``--json``; one bad input) print the
  same bytes on stdout and stderr, with the same exit code, on the same SQLite file and PostgreSQL database;
* ``pareto report`` writes the same HTML (and figures) with its clock fixed;
* ``pareto serve``'s OpenAPI schema is the same (without and with a token);
* the main job (``pareto search``) prints the same lines, numbers masked (see ``mask``): the measured
  values differ run to run, the lines' words and order must not.

The databases are built once, by the OLD code: a short demo search (seeded) and one short ``pareto nightly``.
The old code runs from a git worktree of the revision put first on ``PYTHONPATH``; the new code is the
editable install of this checkout. Run it from the repository root::

    .venv/bin/python benchmarks/same_outputs.py --old c08cd15 \\
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test] [--workdir /tmp/same]

It prints a Markdown table (check | database | result) with a unified diff for each difference, writes it to
``<workdir>/same_outputs.md`` and exits 1 when anything differs, else 0. ``--postgres`` names a server: the
script drops and recreates the database ``same_outputs`` on it. The first run trains the demo model into
``<workdir>/cache`` (about a minute); a run then takes 3 to 6 minutes on a busy 2-core VM.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.executable)
PARETO = PYTHON.parent / "pareto"
STUDY = "demo"
# The main job, shortened: few samples keep every P99 bound undecided, a loose SLO and no contention guard
# keep the verdict words and the lines' order from depending on this machine's load (see `mask`); --keep
# searches every CPU lever without the lever probe, whose timing would otherwise decide the space.
SEARCH = [
    "search", "--task", "demo", "--study", STUDY, "--slo-p99", "10s", "--n-trials", "8", "--seed", "0",
    "--samples", "60", "--rounds", "3", "--warmup", "5", "--no-guard",
    "--keep", "bf16", "--keep", "int8_dynamic", "--keep", "ort_int8_dynamic",
]  # fmt: skip
# A second study, measured as the README's main job measures (decided bounds, a confirmed pick): its
# outputs are timing-dependent, but both sides read the one database the old code built.
MEASURED_STUDY = "measured"
MEASURED = ["search", "--task", "demo", "--study", MEASURED_STUDY, "--slo-p99", "7ms", "--n-trials", "6", "--seed", "0"]
#: ``--no-guard``: the measured study built without the contention guard (a host too busy to finish it)
NO_GUARD = "--no-guard" in sys.argv
NIGHTLY_YAML = """\
study: demo
task: demo
slo:
  p99: 10s
search:
  n_trials: 2
  confirm_top: 0
measure:
  rounds: 3
  samples: 60
  warmup: 5
  contention_limit: null
nightly:
  time_budget: 60s
  remeasure_top: 2
  summary_dir: nightly-reports
"""
READS: list[tuple[str, list[str]]] = [
    ("best", ["best", "--study", STUDY]),
    ("best --json", ["best", "--study", STUDY, "--json"]),
    ("best --min-accuracy 0.9", ["best", "--study", STUDY, "--min-accuracy", "0.9"]),
    ("best --min-accuracy 0.9 --json", ["best", "--study", STUDY, "--min-accuracy", "0.9", "--json"]),
    ("best --study nosuch", ["best", "--study", "nosuch"]),
    ("frontier", ["frontier", "--study", STUDY]),
    ("frontier --json", ["frontier", "--study", STUDY, "--json"]),
    ("explain", ["explain", "--study", STUDY]),
    ("explain --json", ["explain", "--study", STUDY, "--json"]),
    ("explain --min-accuracy 0.9", ["explain", "--study", STUDY, "--min-accuracy", "0.9"]),
    ("studies", ["studies"]),
    ("studies --json", ["studies", "--json"]),
    ("history", ["history", "--study", STUDY]),
    ("history --json", ["history", "--study", STUDY, "--json"]),
]
WHICH_TREE = (
    "import pareto, pareto._migrations, pareto._hardware, pareto._cli.cli as c; "
    "print(pareto.__file__, pareto._migrations.__file__, list(pareto._hardware.__path__), c.__file__)"
)
REPORT_DRIVER = '''\
"""Run `pareto report` with the HTML module's clock fixed, in the old layout or the new."""
import datetime
import importlib
import os
import sys


class _Fixed(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2030, 1, 2, 3, 4, 5, tzinfo=tz)


patched = []
for name in ("pareto.report.html", "pareto.html_report"):  # new layout, old layout
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    if hasattr(module, "datetime"):
        module.datetime = _Fixed
        patched.append(name)
with open(os.environ["SAME_OUTPUTS_NOTE"], "w") as note:
    note.write(" ".join(patched))
if not patched:
    sys.exit("same_outputs: no report module with a datetime to fix")
from pareto._cli.cli import main

sys.argv = ["pareto", *sys.argv[1:]]
main()
'''
OPENAPI_DRIVER = """\
import json, sys
from pareto.serve import create_app
app = create_app(sys.argv[1], token=sys.argv[2] if len(sys.argv) > 2 else None)
print(json.dumps(app.openapi(), sort_keys=True, indent=1))
"""


@dataclass(frozen=True)
class Side:
    """One tree of the code: ``pythonpath`` is the old worktree, None for the editable install."""

    name: str
    pythonpath: Path | None


@dataclass(frozen=True)
class Run:
    rc: int
    out: bytes
    err: bytes

    def as_bytes(self) -> bytes:
        return b"exit %d\n--- stdout\n%s\n--- stderr\n%s" % (self.rc, self.out, self.err)


@dataclass
class Results:
    rows: list[tuple[str, str, bool, list[str]]] = field(default_factory=list)

    def add(self, check: str, database: str, old: bytes, new: bytes) -> None:
        self.rows.append((check, database, old == new, [] if old == new else difference(old, new)))
        print(f"  {check:<40} {database:<10} {'identical' if old == new else 'DIFFERENT'}", flush=True)


def difference(old: bytes, new: bytes) -> list[str]:
    """A unified diff of two texts; sizes and digests of two binary files (figures)."""
    if b"\0" in old + new:
        return [
            f"{name}: {len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}"
            for name, data in (("old", old), ("new", new))
        ]
    lines = [data.decode(errors="replace").splitlines() for data in (old, new)]
    return list(difflib.unified_diff(*lines, "old", "new", lineterm=""))


def environment(side: Side, workdir: Path) -> dict[str, str]:
    """The same environment for both sides but PYTHONPATH: no PARETO_* from the caller, a fixed width."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARETO_") and k != "PYTHONPATH"}
    env.update(COLUMNS="120", LINES="50", TZ="UTC", PYTHONHASHSEED="0", PARETO_CACHE_DIR=str(workdir / "cache"))
    if side.pythonpath is not None:
        env["PYTHONPATH"] = str(side.pythonpath)
    return env


def run(side: Side, argv: list[str], cwd: Path, workdir: Path, extra: dict[str, str] | None = None) -> Run:
    """Run ``argv`` (a command line whose first word is a program) with ``side``'s code."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**environment(side, workdir), **(extra or {})}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    return Run(done.returncode, done.stdout, done.stderr)


def pareto(side: Side, args: list[str], cwd: Path, workdir: Path) -> Run:
    return run(side, [str(PARETO), *args], cwd, workdir)


def old_worktree(rev: str, workdir: Path) -> Path:
    """A worktree of ``rev`` at <workdir>/old whose pareto._migrations and _hardware resolve inside it."""
    old = workdir / "old"
    if not (old / ".git").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(old), rev], check=True)
    else:
        subprocess.run(["git", "-C", str(old), "checkout", "--detach", "--quiet", rev], check=True)
    # the editable finder maps these to this checkout's folders: link the old tree's own instead
    for link, target in (("_migrations", "../migrations"), ("_hardware", "../configs/hardware")):
        subprocess.run(["ln", "-sfn", target, str(old / "pareto" / link)], check=True)
    return old


def verify_trees(old: Side, new: Side, workdir: Path) -> None:
    """Print which files each side imports, and stop unless each side imports its own tree."""
    for side, root in ((old, old.pythonpath), (new, REPO)):
        done = run(side, [str(PYTHON), "-c", WHICH_TREE], workdir, workdir)
        files = done.out.decode().split()
        print(f"{side.name} code: {' '.join(files)}")
        if done.rc != 0 or not files or not all(f.lstrip("['").startswith(str(root)) for f in files):
            sys.exit(f"same_outputs: the {side.name} side does not import its own tree:\n{done.err.decode()}")


def postgres_database(url: str) -> str:
    """Drop and create the database ``same_outputs`` on the server of ``url``; its URL."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("DROP DATABASE IF EXISTS same_outputs WITH (FORCE)"))
        conn.execute(sa.text("CREATE DATABASE same_outputs"))
    engine.dispose()
    return sa.engine.make_url(url).set(database="same_outputs").render_as_string(hide_password=False)


def build(old: Side, db_url: str, cwd: Path, workdir: Path) -> Run:
    """Fill ``db_url`` with the old code: the short search, then one nightly; the search's output."""
    if cwd.exists():
        shutil.rmtree(cwd)
    cwd.mkdir(parents=True)
    (cwd / "nightly.yaml").write_text(NIGHTLY_YAML)
    started = time.monotonic()
    job = pareto(old, [*SEARCH, "--db", db_url], cwd, workdir)
    nightly = pareto(old, ["nightly", "--config", "nightly.yaml", "--db", db_url], cwd, workdir)
    measured = pareto(old, [*MEASURED, *(["--no-guard"] if NO_GUARD else []), "--db", db_url], cwd, workdir)
    print(f"  built {db_url} with the old code in {time.monotonic() - started:.0f} s", flush=True)
    for name, done in (("search", job), ("nightly", nightly), ("measured search", measured)):
        if done.rc != 0:
            sys.exit(f"same_outputs: the old {name} failed (exit {done.rc}):\n{done.err.decode()[-3000:]}")
    return job


def compare_reads(sides: tuple[Side, Side], db_url: str, label: str, workdir: Path, results: Results) -> None:
    """Every read command with both sides on ``db_url``: exit code, stdout and stderr byte for byte."""
    for study in (STUDY, MEASURED_STUDY):
        for check, args in READS:
            args = [MEASURED_STUDY if a == STUDY and study == MEASURED_STUDY else a for a in args]
            old, new = (
                pareto(side, [*args, "--db", url], workdir / "run", workdir)
                for side, url in zip(sides, _urls(db_url), strict=True)
            )
            results.add(f"`pareto {check}` ({study})", label, old.as_bytes(), new.as_bytes())


def report(side: Side, db_url: str, workdir: Path, study: str) -> tuple[Run, dict[str, bytes], str]:
    """``pareto report`` with the clock fixed: its run, the files it wrote and the module patched."""
    driver, note, folder = workdir / "drivers" / "report.py", workdir / "drivers" / "note", workdir / "report"
    driver.parent.mkdir(parents=True, exist_ok=True)
    driver.write_text(REPORT_DRIVER)
    if folder.exists():
        shutil.rmtree(folder)  # the same path for both sides: it may appear in the output
    argv = [str(PYTHON), str(driver), "report", "--study", study, "-o", str(folder), "--db", db_url]
    done = run(side, argv, workdir / "run", workdir, {"SAME_OUTPUTS_NOTE": str(note)})
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}
    return done, files, note.read_text() if note.exists() else ""


#: A database's copy for the new code, upgraded by it, when the change adds a schema revision (the old code
#: refuses a newer schema, the new one an older): the old code reads the original, the new one the copy.
NEW_URLS: dict[str, str] = {}


def _urls(db_url: str) -> tuple[str, str]:
    return db_url, NEW_URLS.get(db_url, db_url)


def new_copy(new: Side, url: str, workdir: Path) -> str:
    """A copy of ``url`` (SQLite: the file; PostgreSQL: ``CREATE DATABASE ... TEMPLATE``) upgraded by the
    new code (``pareto db upgrade``); its URL."""
    import sqlalchemy as sa

    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        copy = path.with_name(f"{path.stem}-new{path.suffix}")
        shutil.copy(path, copy)
        target = f"sqlite:///{copy}"
    else:
        made = sa.engine.make_url(url)
        engine = sa.create_engine(made.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text("DROP DATABASE IF EXISTS same_outputs_new WITH (FORCE)"))
            conn.execute(sa.text(f"CREATE DATABASE same_outputs_new TEMPLATE {made.database}"))
        engine.dispose()
        target = made.set(database="same_outputs_new").render_as_string(hide_password=False)
    done = pareto(new, ["db", "upgrade", "--db", target], workdir / "run", workdir)
    print(f"  the new code's copy {target}: pareto db upgrade exit {done.rc}", flush=True)
    return target


def compare_report(sides: tuple[Side, Side], db_url: str, label: str, workdir: Path, results: Results) -> None:
    for study in (STUDY, MEASURED_STUDY):
        (old_run, old_files, old_mod), (new_run, new_files, new_mod) = (
            report(s, url, workdir, study) for s, url in zip(sides, _urls(db_url), strict=True)
        )
        print(f"  report clock fixed in {old_mod or 'nothing'} (old), {new_mod or 'nothing'} (new)")
        results.add(f"`pareto report` run ({study})", label, old_run.as_bytes(), new_run.as_bytes())
        html = old_files.get("index.html", b""), new_files.get("index.html", b"")
        results.add(f"report HTML, fixed clock ({study})", label, *html)
        names = "\n".join(sorted(old_files)).encode(), "\n".join(sorted(new_files)).encode()
        results.add(f"report file list ({study})", label, *names)
        for name in sorted(name for name in {*old_files, *new_files} if name != "index.html"):
            figure = old_files.get(name, b"<missing>"), new_files.get(name, b"<missing>")
            results.add(f"report {name} ({study})", label, *figure)


def compare_openapi(sides: tuple[Side, Side], db_url: str, label: str, workdir: Path, results: Results) -> None:
    """serve's OpenAPI schema from ``create_app`` in each tree, keys sorted; without and with a token."""
    driver = workdir / "drivers" / "openapi.py"
    driver.parent.mkdir(parents=True, exist_ok=True)
    driver.write_text(OPENAPI_DRIVER)
    for check, extra in (("serve OpenAPI schema", []), ("serve OpenAPI schema (token)", ["secret"])):
        old, new = (run(s, [str(PYTHON), str(driver), db_url, *extra], workdir / "run", workdir) for s in sides)
        results.add(check, label, old.as_bytes(), new.as_bytes())


_HEX = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{8,}\b")  # digests: environment keys, programs
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_RULE = re.compile(r"([─━│┃┏┓┗┛┡┩╇┳┻┼╭╮╰╯═])\1+")


def mask(text: bytes, unwrap: bool = False) -> bytes:
    """What is measured, masked: hex digests as H, every number as N; runs of spaces and of one box-drawing
    character (whose lengths follow the numbers' widths) shortened to one. With ``unwrap`` (stdout, whose
    tables and captions wrap at a width that follows the measured numbers' widths), a table row's wrapped
    continuation is joined to it cell by cell, spaces in cells dropped (a wrap may fall inside a word), and each
    run of text lines is joined into one line."""
    lines = []
    for line in text.decode(errors="replace").splitlines():
        line = _RULE.sub(r"\1", _NUMBER.sub("N", _HEX.sub("H", line)))
        lines.append(" ".join(line.split()))
    return "\n".join(unwrapped(lines) if unwrap else lines).encode()


def unwrapped(lines: list[str]) -> list[str]:
    """``lines`` with wrapped table rows and wrapped text joined (see ``mask``)."""
    out: list[str] = []
    text = False  # whether the last line out is text
    for line in lines:
        if line[:1] in "│┃":
            cells = ["".join(cell.split()) for cell in line.split(line[0])]
            last = out[-1].split(" │ ") if out and not text else []
            if len(cells) > 2 and not cells[1] and len(last) == len(cells):
                cells = [a + b for a, b in zip(last, cells, strict=True)]
                out.pop()
            out.append(" │ ".join(cells))
            text = False
        elif line[:1] in "┏┡└╭╰┗" or not line:
            out.append(line)
            text = False
        else:
            out[-1:] = [f"{out[-1]} {line}"] if text else [*out[-1:], line]
            text = True
    return out


def compare_job(new: Side, old_job: Run, workdir: Path, results: Results) -> None:
    """The main job's lines: the same search with the new code into a fresh SQLite file, numbers masked."""
    cwd = workdir / "job-new"
    if cwd.exists():
        shutil.rmtree(cwd)
    started = time.monotonic()
    job = pareto(new, [*SEARCH, "--db", "sqlite:///same.db"], cwd, workdir)
    print(f"  the new search ran in {time.monotonic() - started:.0f} s", flush=True)
    label = "masked: sqlite"
    results.add("main job exit code", label, b"%d" % old_job.rc, b"%d" % job.rc)
    results.add("main job stdout lines", label, mask(old_job.out, unwrap=True), mask(job.out, unwrap=True))
    results.add("main job stderr lines", label, mask(old_job.err), mask(job.err))


def table(results: Results) -> str:
    lines = ["| check | database | result |", "| --- | --- | --- |"]
    lines += [f"| {c} | {db} | {'identical' if same else '**DIFFERENT**'} |" for c, db, same, _ in results.rows]
    lines += [
        "",
        "The main job's lines (database `masked: sqlite`) come from two separate runs, the old one that built "
        "the SQLite file and a new one into a fresh file with the same arguments and seed: they are compared "
        "after masking what is measured (every number as N, hex digests as H, runs of spaces and table rules "
        "shortened; on stdout wrapped table rows and text lines joined, as the wrap follows the numbers' widths), "
        "since timings differ run to run; the lines' words and order must not. Everything else is compared byte "
        "for byte.",
    ]
    for check, db, same, diff in results.rows:
        if not same:
            shown = "\n".join(diff[:40]) + (f"\n... ({len(diff) - 40} more diff lines)" if len(diff) > 40 else "")
            lines += ["", f"### {check} ({db})", "", "```diff", shown, "```"]
    return "\n".join(lines) + "\n"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the old git revision, e.g. c08cd15")
    parser.add_argument("--postgres", help="a PostgreSQL server URL; the database same_outputs is recreated on it")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/same"), help="scratch folder [/tmp/same]")
    parser.add_argument(
        "--no-guard", action="store_true", help="build the measured study without the contention guard (a busy host)"
    )
    return parser.parse_args()


def main() -> int:
    args = arguments()
    started, workdir = time.monotonic(), args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    old = Side("old", old_worktree(args.old, workdir))
    new = Side("new", None)
    verify_trees(old, new, workdir)
    databases = [("sqlite", f"sqlite:///{workdir / 'job-old' / 'same.db'}", workdir / "job-old")]
    if args.postgres:
        databases.append(("postgres", postgres_database(args.postgres), workdir / "build-postgres"))
    results, jobs = Results(), {}
    for label, url, cwd in databases:
        jobs[label] = build(old, url if label != "sqlite" else "sqlite:///same.db", cwd, workdir)
    for _, url, _ in databases:
        NEW_URLS[url] = new_copy(new, url, workdir)
    for label, url, _ in databases:
        print(f"{label}: {url}", flush=True)
        compare_reads((old, new), url, label, workdir, results)
        compare_report((old, new), url, label, workdir, results)
    compare_openapi((old, new), databases[0][1], "-", workdir, results)
    compare_job(new, jobs["sqlite"], workdir, results)
    text = table(results)
    (workdir / "same_outputs.md").write_text(text)
    print("\n" + text)
    print(f"Old {args.old} against the working tree: {time.monotonic() - started:.0f} s in all.")
    return 0 if all(same for _, _, same, _ in results.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
