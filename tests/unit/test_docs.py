"""The documentation stays a map, not a lab notebook.

README.md and docs/ describe what the code does now: pages stay short, carry no dates, issue
numbers or load averages (a measurement belongs in a dated file under benchmarks/results/, whose
header says when, at which commit, on what machine, under what load and with which command), and
every repository path or link they give exists. The floor list in docs/design/architecture.md is
the one tests/unit/test_layering.py enforces. Fenced blocks are checked by
tests/integration/test_readme_commands.py, JSON configs by tests/unit/test_readme.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from test_layering import FLOORS

README = REPO / "README.md"
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
RESULT_FILES = sorted(p for p in RESULTS.glob("*.md") if p.name != "README.md")

MAX_README_LINES = 300
MAX_PAGE_LINES = 400

DATE = re.compile(r"20\d\d-\d\d-\d\d")
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+", re.I)
# A link or path to a result file names its date; that is where dates belong.
RESULT_PATH = re.compile(r"benchmarks/results/[\w.-]+")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
# A backticked word is a repository path when it starts at a top-level folder, or at a package
# of genai_runtime (the short form ``kv/cross.py`` is a path too, and must be written in full).
TOP = {"genai_runtime", "tests", "benchmarks", "docs", "schemas", "presets", "examples", ".ci"}
SUBPACKAGES = {
    p.name for p in (REPO / "genai_runtime").iterdir() if p.is_dir() and p.name[0] not in "._"
}


def _rel(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def _prose(page: Path) -> str:
    """The page without its fenced blocks (those are checked as commands and configs)."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", _prose(page), re.M)}


def test_pages_stay_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES
    assert len(PAGES) > 10
    for page in PAGES[1:]:
        lines = len(page.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_PAGE_LINES, (_rel(page), lines)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_dates_issue_numbers_or_load_averages(page: Path) -> None:
    text = RESULT_PATH.sub("", page.read_text(encoding="utf-8"))
    for pattern in (DATE, ISSUE, re.compile("load average", re.I)):
        found = pattern.findall(text)
        assert not found, (_rel(page), found, "move measurements to benchmarks/results/")


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_links_resolve(page: Path) -> None:
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not ours to check offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), (_rel(page), target)
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), (_rel(page), target)


def _path_problems(prose: str, folder: Path) -> list[str]:
    """The backticked repository paths in ``prose`` that exist neither from the repository root
    nor from ``folder``, and the ``path::test`` names whose file does not define that test."""
    problems = []
    for word in CODE.findall(prose):
        word = word.strip().rstrip(".,;:")
        path, _, test = word.partition("::")
        if " " in path or "<" in path or "/" not in path:
            continue  # prose, a template (``<date>-<topic>.md``) or a single name
        if path.split("/", 1)[0] not in TOP | SUBPACKAGES:
            continue
        found = [p for p in (REPO / path, folder / path) if p.exists()]
        if not found or (test and f"def {test}(" not in found[0].read_text(encoding="utf-8")):
            problems.append(word)
    return problems


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_named_repository_paths_exist(page: Path) -> None:
    assert not _path_problems(_prose(page), page.parent), _rel(page)


def test_the_path_check_reports_short_missing_and_unknown_tests() -> None:
    prose = (
        "`kv/cross.py`, `genai_runtime/kv/cross.py`, `tests/unit/test_docs.py::nope`, "
        "`tests/unit/test_docs.py::test_pages_stay_short`, `text/event-stream`, `/health`, "
        "`genai_runtime/no_such_module.py`, `../shared/models/x`, `docs/guide/`, `docs/<page>.md`"
    )
    assert _path_problems(prose, DOCS) == [
        "kv/cross.py",
        "tests/unit/test_docs.py::nope",
        "genai_runtime/no_such_module.py",
    ]


def test_readme_maps_every_docs_page() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(_prose(README))
    }
    missing = [_rel(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, missing


# -- benchmarks/results ---------------------------------------------------------------------

HEADER = ("Date", "Commit", "Machine", "Load", "Command")


def _header(result: Path) -> dict[str, str]:
    head = result.read_text(encoding="utf-8").splitlines()[:12]
    return {m[1]: m[2].strip() for line in head if (m := re.match(r"- (\w+): (.+)$", line))}


def _full_history() -> bool:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return False
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.returncode == 0 and out.stdout.strip() == "false"


@pytest.mark.parametrize("result", RESULT_FILES, ids=lambda p: p.name)
def test_result_files_carry_their_header(result: Path) -> None:
    assert re.fullmatch(r"20\d\d-\d\d-\d\d-[a-z0-9-]+\.md", result.name), result.name
    header = _header(result)
    missing = [field for field in HEADER if not header.get(field)]
    assert not missing, (result.name, missing)
    assert header["Date"] == result.name[:10], result.name
    commit = header["Commit"]
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit), (result.name, commit)
    if _full_history():
        # On main's history, not merely in this clone's objects: an amended commit
        # lingers locally but is missing from a fresh clone.
        known = subprocess.run(
            ["git", "-C", str(REPO), "merge-base", "--is-ancestor", commit, "HEAD"],
            capture_output=True,
            check=False,
        )
        assert known.returncode == 0, (result.name, commit)


def _dated(result: Path) -> tuple[str, int, str]:
    """(date, rerun, topic) of a result file: a second measurement on one day is
    ``<date>-<topic>-2.md``."""
    rerun = re.search(r"-(\d+)\.md$", result.name)
    topic = result.name[11:]
    if rerun:
        topic = topic[: -len(rerun[0])] + ".md"
    return result.name[:10], int(rerun[1]) if rerun else 1, topic


def test_results_index_names_the_latest_file_per_topic() -> None:
    assert RESULT_FILES
    latest: dict[str, str] = {}
    for result in sorted(RESULT_FILES, key=_dated):  # by date, then the day's rerun, per topic
        latest[_dated(result)[2]] = result.name
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1:-1] for line in index.splitlines() if line.startswith("| ")]
    listed_latest = {name for row in rows[1:] for name in LINK.findall(row[1])}
    listed = set(LINK.findall(index))
    assert listed_latest == set(latest.values())
    assert {p.name for p in RESULT_FILES} <= listed
    for name in listed:
        assert (RESULTS / name).exists(), name


# -- the floors -----------------------------------------------------------------------------


def test_architecture_lists_the_floors_the_layering_test_enforces() -> None:
    text = (DOCS / "design" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- floors:begin -->", 1)[1].split("<!-- floors:end -->", 1)[0]
    floors = tuple(
        tuple(CODE.findall(item.split(" — ", 1)[0]))
        for item in re.findall(r"^\d+\.\s+(.*)$", block, re.M)
    )
    assert floors == FLOORS
