"""`pareto report`: the page and its figures from a real tiny search, in a real browser, and bad input."""

from __future__ import annotations

import html
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import cli
import pareto
from pareto.spec import SearchSpec
from pareto.study.search import run_search

pytest.importorskip("matplotlib")

#: Characters HTML must escape, in the study's name: the page must show them, never interpret them.
STUDY = "tiny <b>&'\""
FIGURES = {"pareto.png", "latency.png", "roofline.png", "throughput.png", "compression.png"}
#: Set to a path to keep the browser's screenshot of the page (to look at it).
SCREENSHOT_ENV = "PARETO_REPORT_SCREENSHOT"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A database with this host's calibration and a short search of the tiny task, each trial with a
    throughput sweep and placed on the roofline (``hardware: auto`` uses the calibration on a CPU)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('report')}/pareto.db"
    pareto.api.calibrate(device="cpu", threads=1, seconds=0.5, db=url)
    spec = SearchSpec.model_validate(
        {
            "task": "tests.tiny_task:make_task",
            "study": STUDY,
            "slo": {"p99": "1s"},
            "search": {"n_trials": 4, "seed": 1},
            # the guard on, with a limit a shared CI machine's neighbours do not reach
            "measure": {"device": "cpu", "threads": 1, "warmup": 5, "contention_limit": 50, "throughput_sweep": True},
            "space": {"techniques": {"int8_dynamic": {}, "prune_structured": {"ratio": [0.25, 0.5]}}},
        }
    )
    run_search(spec, db_url=url)
    return url


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["report", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def one_line(text: str) -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def dump(url: str) -> list[str]:
    """Every row of the SQLite database, as SQL."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return list(conn.iterdump())


def middle_slo(db: str) -> str:
    """A P99 SLO between the trials' P99 upper bounds: some trials meet it, some miss it."""
    bounds = sorted(r["metrics"]["latency_p99_upper_ms"] for r in pareto.api.trials(study=STUDY, db=db))
    assert len(bounds) >= 2 and bounds[0] < bounds[-1]
    return f"{(bounds[0] + bounds[-1]) / 2 * 1000:.3f}us"


def test_report_writes_the_page_with_every_figure(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    slo = middle_slo(db)
    before = dump(db)
    rc, stdout, stderr = report(capsys, "--study", STUDY, "-o", str(out), "--slo-p99", slo, "--db", db)
    assert rc == 0, stderr
    assert one_line(stdout) == f"{out / 'index.html'} (5 figures)"
    assert dump(db) == before  # nothing in the database changed
    assert {p.name for p in out.iterdir()} == FIGURES | {"index.html"}
    page = (out / "index.html").read_text(encoding="utf-8")
    images = re.findall(r"<img ([^>]*)>", page)
    assert len(images) == len(FIGURES)
    for attrs in images:
        src = re.search(r'src="([^"]+)"', attrs)
        assert src and src.group(1) in FIGURES and (out / src.group(1)).stat().st_size > 10_000
        assert re.search(r'alt="[^"]{20,}"', attrs) and re.search(r'width="\d+" height="\d+"', attrs)
    # self-contained: nothing fetched from anywhere else
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<link" not in page and "@import" not in page
    assert not re.search(r"<script[^>]+src=", page)
    # every text escaped: the study's name shows as text, never as markup
    assert "tiny &lt;b&gt;&amp;&#x27;&quot;" in page and "<b>&" not in page
    # the pick, the frontier and the judgement are those of `pareto best` and `pareto frontier`
    pick = pareto.best(study=STUDY, slo_p99=slo, db=db)
    front = pareto.frontier(study=STUDY, slo_p99=slo, db=db)
    assert f"The pick: trial {pick['trial']}" in page
    rows = re.findall(r'<tr(?: class="picked")?><td class="n">(\d+)</td>', page)
    assert [int(n) for n in rows] == [r["trial"] for r in front]
    judged = [r["slo"]["feasible"] for r in pareto.api.trials(study=STUDY, slo_p99=slo, db=db)]
    assert f"{judged.count(True)} meet the SLO, {judged.count(False)} miss it" in page
    assert "drawn through the stored percentiles" in page
    assert pick["metrics"]["method"].split(" | ")[0] in html.unescape(page)


def test_a_study_where_nothing_meets_the_slo_names_the_closest(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, stdout, stderr = report(capsys, "--study", STUDY, "-o", str(tmp_path / "r"), "--slo-p99", "1ns", "--db", db)
    assert rc == 0, stderr
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    with pytest.raises(pareto.errors.NoFeasibleConfiguration) as caught:
        pareto.best(study=STUDY, slo_p99="1ns", db=db)
    closest = re.search(r"the closest is trial (\d+)", str(caught.value))
    assert closest and f"No pick; the closest is trial {closest.group(1)}" in page
    assert html.escape(str(caught.value)) in page
    assert "5 figures" in stdout


def test_missing_data_is_said_on_the_page_instead_of_a_figure(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pareto import api
    from pareto.report.html import write_report

    real = api.trials

    def without_sweep_or_compute(**kwargs: object) -> list[dict[str, object]]:
        rows = real(**kwargs)  # type: ignore[arg-type]
        for r in rows:
            metrics = r["metrics"]
            assert isinstance(metrics, dict)
            metrics.update(throughput_curve=None, flops=None, bytes_moved=None)
        return rows

    monkeypatch.setattr(api, "trials", without_sweep_or_compute)
    result = write_report(tmp_path / "r", study=STUDY, db=db)
    assert set(result["skipped"]) == {"throughput", "roofline", "history"} and len(result["figures"]) == 3
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert "No throughput curve was measured in this study" in page and "throughput_sweep: true" in page
    assert "no trial stores its FLOPs and bytes moved" in page
    assert not (tmp_path / "r" / "throughput.png").exists()


def test_the_nightly_history_figure_shows_the_pick_measured_and_drift_corrected(db: str, tmp_path: Path) -> None:
    from sqlalchemy import select

    from pareto.report.html import write_report
    from pareto.store.engine import open_engine, session_scope
    from pareto.store.models import Measurement, NightlyRun, Study

    copy = tmp_path / "nightly.db"
    with sqlite3.connect(db.removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)  # the WAL's pages too
    url = f"sqlite:///{copy}"
    pick = pareto.best(study=STUDY, db=url)["trial"]
    with session_scope(open_engine(url)) as session:
        study = session.scalars(select(Study)).one()
        env_id = session.scalars(select(Measurement.environment_id)).first()
        for night, (p99, corrected, status) in enumerate(
            [(1.0, 1.0, "ok"), (1.4, 1.02, "ok"), (1.5, 1.45, "regression")]
        ):
            view = {"trial": pick, "p99_ms": p99, "corrected_p99_ms": corrected, "level_ms": 1.0, "band_upper_ms": 1.2}
            session.add(
                NightlyRun(
                    study_id=study.id, status=status, environment_id=env_id, hostname="h", pid=1,
                    summary={"started_at": f"2026-12-0{night + 1}T03:00:00", "drift": {"pick": view}},
                )
            )  # fmt: skip
    result = write_report(tmp_path / "r", study=STUDY, db=url)
    assert "history" not in result["skipped"] and (tmp_path / "r" / "history.png").stat().st_size > 10_000
    page = (tmp_path / "r" / "index.html").read_text(encoding="utf-8")
    assert "over 3 nights: measured 1 to 1.5 ms, drift-corrected 1 to 1.45 ms; 1 nights called a regression" in page
    assert "with the machine&#x27;s drift taken out" in page


def test_the_page_renders_with_every_image_in_chromium(db: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (apt-get install chromium); the page is checked without a browser")
    from pareto.report.html import write_report

    index = Path(write_report(tmp_path / "r", study=STUDY, db=db)["index"])
    browser = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*browser, "--dump-dom", "--virtual-time-budget=5000", index.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body, dom.stderr[-2000:]
    assert f'data-images-loaded="{len(FIGURES)}/{len(FIGURES)}"' in body.group(0)
    shot = screenshot(index, tmp_path / "page.png", chromium)
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one


def screenshot(page: Path, path: Path, chromium: str = "chromium") -> Path:
    """A 1280-pixel-wide screenshot of the page; copied to $PARETO_REPORT_SCREENSHOT when that is set."""
    subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={path}",
            "--window-size=1280,4800",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(path, os.environ[SCREENSHOT_ENV])
    return path


def test_a_folder_with_files_is_refused_unless_forced(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, stdout, stderr = report(capsys, "--study", STUDY, "-o", str(out), "--db", db)
    assert rc == 2 and not stdout
    assert "not empty" in one_line(stderr) and "--force" in stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    rc, stdout, stderr = report(capsys, "--study", STUDY, "-o", str(out), "--db", db, "--force")
    assert rc == 0, stderr
    assert (out / "index.html").exists() and (out / "notes.txt").read_text() == "mine"


def test_a_folder_that_cannot_be_written_is_one_sentence(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("a file, not a folder")
    rc, _, stderr = report(capsys, "--study", STUDY, "-o", str(blocker / "out"), "--db", db)
    assert rc == 2
    assert "Cannot write the report" in one_line(stderr) and "is a file" in stderr
    rc, _, stderr = report(capsys, "--study", STUDY, "-o", str(blocker), "--db", db)
    assert rc == 2 and "is a file" in one_line(stderr)


def test_an_unknown_study_is_one_sentence(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, stderr = report(capsys, "--study", "nope", "-o", str(tmp_path / "r"), "--db", db)
    assert rc == 2
    assert "No study named 'nope'" in one_line(stderr)
    assert not (tmp_path / "r").exists()  # nothing created for a report that could not be made


def test_all_environments_is_refused(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, stderr = report(capsys, "--study", STUDY, "-o", str(tmp_path / "r"), "--environment", "all", "--db", db)
    assert rc == 2 and "--environment KEY" in one_line(stderr)


def test_without_matplotlib_the_report_says_what_to_install(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    rc, _, stderr = report(capsys, "--study", STUDY, "-o", str(tmp_path / "r"), "--db", db)
    assert rc == 1
    assert "pip install 'pareto-slo[report]'" in one_line(stderr)
    assert not (tmp_path / "r").exists()
