"""Run onnxruntime-genai's own Python API test file against genai_runtime and the reference.

The file (``test/python/test_onnxruntime_genai_api.py``) and its test models are taken from a
pinned revision of the reference repository at run time, never vendored: from
``--source`` (a git URL, or a local git directory such as a mirror), default GitHub. Blobs the
source lacks are left out (the tests that need them fail on both sides). Offline, the script
says so and exits 0 (``--require`` makes that an error).

Each side runs in its own pytest process: "reference" imports the installed
``onnxruntime_genai``; "genai_runtime" runs the same file through an import shim that makes
``import onnxruntime_genai as og`` bind ``genai_runtime``. Prints pass/skip/fail per side and the
tests whose outcome differs; ``--json`` writes every test's outcome.

    python benchmarks/reference_api_conformance.py [--source URL_OR_GIT_DIR] [--rev SHA]
        [--sides genai_runtime,reference] [--json OUT] [-k EXPR] [--test-file PATH]

``--test-file`` runs another file of the reference's ``test/python`` the same way, e.g.
``test/python/test_onnxruntime_genai_engine.py`` (its engine tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_SOURCE = "https://github.com/microsoft/onnxruntime-genai.git"
# main of 2026-08-22 ("Add Tool Calling and Constrained Decoding to Engine (#2412)").
PINNED_REV = "a0c04eb1313b886c963e415bbd974748cb89a4eb"
TEST_FILE = "test/python/test_onnxruntime_genai_api.py"
PATHS = ("test/python", "test/models", "test/audios", "test/images")
SIDES = ("genai_runtime", "reference")

# Loaded with ``pytest -p``: runs before any test module is imported.
SHIM = '''"""Make ``import onnxruntime_genai`` bind genai_runtime (conformance run)."""
import sys

import genai_runtime

sys.modules["onnxruntime_genai"] = genai_runtime
'''


class SourceUnavailable(Exception):
    pass


def _git(*args: str, cwd: Path | None = None, data: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, input=data, capture_output=True, check=False, timeout=600
    )
    if proc.returncode != 0:
        raise SourceUnavailable(proc.stderr.decode(errors="replace").strip().splitlines()[-1:])
    return proc.stdout


def git_dir_for(source: str, rev: str, work: Path) -> Path:
    """A git directory holding ``rev``: the source itself when local, else a shallow fetch."""
    local = Path(source).expanduser()
    if local.exists():
        for candidate in (local / ".git", local):
            try:
                _git("--git-dir", str(candidate), "cat-file", "-e", f"{rev}^{{commit}}")
                return candidate
            except SourceUnavailable:
                continue
        raise SourceUnavailable(f"{source} does not hold revision {rev}")
    clone = work / "clone.git"
    _git("init", "-q", "--bare", str(clone))
    _git("--git-dir", str(clone), "fetch", "-q", "--depth", "1", source, rev)
    return clone


def extract(git_dir: Path, rev: str, dest: Path, test_file: str = TEST_FILE) -> list[str]:
    """Write PATHS at ``rev`` under ``dest``; return the files whose blobs the source lacks."""
    listing = _git("--git-dir", str(git_dir), "ls-tree", "-r", "-z", rev, "--", *PATHS)
    entries = []
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, path = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and mode != b"120000":
            entries.append((sha.decode(), path.decode()))
    if not any(path == test_file for _, path in entries):
        raise SourceUnavailable(f"{test_file} is not in revision {rev}")
    missing = []
    for sha, path in entries:
        target = dest / path
        if dest.resolve() not in target.resolve().parents:  # a hostile tree cannot escape
            raise SourceUnavailable(f"path escapes the checkout: {path}")
        proc = subprocess.run(
            ["git", "--git-dir", str(git_dir), "cat-file", "blob", sha],
            capture_output=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            missing.append(path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(proc.stdout)
    return missing


def run_side(
    side: str, checkout: Path, work: Path, select: str | None, test_file: str = TEST_FILE
) -> dict[str, str]:
    """Run the test file for one side; return {test id: passed|skipped|failed}."""
    report = work / f"{side}.xml"
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        "--rootdir", str(checkout / "test" / "python"), f"--junitxml={report}",
        "--test_models", str(checkout / "test" / "test_models"),
    ]  # fmt: skip
    env = dict(os.environ)
    if side == "genai_runtime":
        (work / "shim").mkdir(exist_ok=True)
        (work / "shim" / "genai_runtime_as_og.py").write_text(SHIM)
        paths = [str(work / "shim"), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        cmd += ["-p", "genai_runtime_as_og"]
    if select:
        cmd += ["-k", select]
    cmd.append(str(checkout / test_file))
    subprocess.run(cmd, cwd=checkout / "test" / "python", env=env, check=False)
    if not report.exists():
        raise SystemExit(f"{side}: pytest wrote no report")
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "?")
        if case.find("skipped") is not None:
            outcomes[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        else:
            outcomes[name] = "passed"
    return outcomes


def counts(outcomes: dict[str, str]) -> dict[str, int]:
    out = {"passed": 0, "skipped": 0, "failed": 0}
    for value in outcomes.values():
        out[value] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        default=os.environ.get("GENAI_RUNTIME_REFERENCE_REPO", DEFAULT_SOURCE),
        help="git URL or local git directory of onnxruntime-genai "
        "(env GENAI_RUNTIME_REFERENCE_REPO; default GitHub)",
    )
    parser.add_argument("--rev", default=PINNED_REV)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--json", help="write every test's outcome per side here")
    parser.add_argument("-k", dest="select", help="pytest -k expression")
    parser.add_argument("--test-file", default=TEST_FILE, help="a test file of the reference's")
    parser.add_argument(
        "--require", action="store_true", help="fail when the source is unreachable"
    )
    args = parser.parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides {sorted(unknown)} (expected {', '.join(SIDES)})")
    with tempfile.TemporaryDirectory(prefix="og-api-conformance-") as tmp:
        work = Path(tmp)
        checkout = work / "checkout"
        try:
            git_dir = git_dir_for(args.source, args.rev, work)
            missing = extract(git_dir, args.rev, checkout, args.test_file)
        except (SourceUnavailable, OSError, subprocess.TimeoutExpired) as exc:
            print(f"skipped: cannot read {args.test_file} at {args.rev} from {args.source}: {exc}")
            return 1 if args.require else 0
        print(f"{args.test_file} @ {args.rev[:12]} from {args.source}")
        if missing:
            print(f"blobs missing from the source (left out): {', '.join(missing)}")
        results = {
            side: run_side(side, checkout, work, args.select, args.test_file) for side in sides
        }
    print()
    width = max(len(s) for s in sides)
    for side in sides:
        c = counts(results[side])
        print(f"{side.ljust(width)}  passed {c['passed']:3d}  skipped {c['skipped']:3d}  "
              f"failed {c['failed']:3d}")  # fmt: skip
    if len(sides) == 2:
        ours, ref = (results[s] for s in SIDES)
        for name, a, b in (("reference", ref, ours), ("genai_runtime", ours, ref)):
            other = "genai_runtime" if name == "reference" else "reference"
            only = sorted(t for t, v in a.items() if v == "passed" and b.get(t) != "passed")
            print(f"\npassed on {name}, not on {other} ({len(only)}):")
            for test in only:
                print(f"  {test}: {other} {b.get(test, 'not collected')}")
        # Device-parametrized ids follow each side's is_*_available answers.
        skipped_only = [t for t in set(ours) ^ set(ref) if (ours.get(t) or ref.get(t)) == "skipped"]
        print(f"\nskipped ids collected on one side only (device parameters): {len(skipped_only)}")
    if args.json:
        meta = {"source": args.source, "rev": args.rev, "missing_blobs": missing}
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
