"""A model folder is untrusted: file names must stay inside it, native code needs trust.

Escapes are reported at the JSON path where the name was written (v1 or v2), before any
translation, so the message points at the line the user has to fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import tiny_models

from genai_runtime.config import load
from genai_runtime.config.paths import check_paths, resolve_inside
from genai_runtime.errors import ModelError, PathEscapeError, TrustError
from genai_runtime.model import Config, Model

V1_DECODER: dict[str, Any] = {
    "model": {
        "type": "llama",
        "eos_token_id": 2,
        "context_length": 64,
        "decoder": {"filename": "model.onnx"},
    },
    "search": {"max_length": 32},
}
V1_PIPELINE: dict[str, Any] = {
    "model": {
        "type": "decoder-pipeline",
        "eos_token_id": 2,
        "context_length": 64,
        "decoder": {
            "pipeline": [
                {
                    "embeddings": {"filename": "embeds.onnx", "outputs": ["e"]},
                    "transformer": {"filename": "transformer.onnx", "inputs": ["e"]},
                }
            ]
        },
    },
}


def v2_decoder(file: str = "model.onnx", **session: Any) -> dict[str, Any]:
    return {
        "version": 2,
        "pipeline": {
            "extends": "autoregressive-decoder",
            "sessions": {"decoder": {"file": file, **session}},
        },
    }


def write(folder: Path, doc: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def escape(folder: Path, **kwargs: Any) -> PathEscapeError:
    with pytest.raises(PathEscapeError) as info:
        load(folder, **kwargs)
    return info.value


def paths(exc: PathEscapeError) -> list[str]:
    return [p.path for p in exc.problems]


BAD_NAMES = ["../outside.onnx", "sub/../../outside.onnx", "/etc/passwd", "C:\\models\\m.onnx"]


# ------------------------------------------------------------------------------ v1


@pytest.mark.parametrize("name", BAD_NAMES)
def test_v1_decoder_filename_escape(tmp_path: Path, name: str) -> None:
    doc = json.loads(json.dumps(V1_DECODER))
    doc["model"]["decoder"]["filename"] = name
    exc = escape(write(tmp_path / "m", doc))
    assert paths(exc) == ["model.decoder.filename"]
    assert repr(name) in str(exc)


def test_v1_absolute_path_message(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(V1_DECODER))
    doc["model"]["decoder"]["filename"] = "/abs/model.onnx"
    exc = escape(write(tmp_path, doc))
    assert "absolute paths are not allowed, got '/abs/model.onnx'" in str(exc)


@pytest.mark.parametrize("name", BAD_NAMES[:3])
def test_v1_pipeline_stage_filename_escape(tmp_path: Path, name: str) -> None:
    doc = json.loads(json.dumps(V1_PIPELINE))
    doc["model"]["decoder"]["pipeline"][0]["embeddings"]["filename"] = name
    exc = escape(write(tmp_path / "m", doc))
    assert paths(exc) == ["model.decoder.pipeline[0].embeddings.filename"]


def test_every_escape_is_reported(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(V1_PIPELINE))
    doc["model"]["decoder"]["pipeline"][0]["embeddings"]["filename"] = "../a.onnx"
    doc["model"]["decoder"]["pipeline"][0]["transformer"]["filename"] = "/b.onnx"
    exc = escape(write(tmp_path / "m", doc))
    assert sorted(paths(exc)) == [
        "model.decoder.pipeline[0].embeddings.filename",
        "model.decoder.pipeline[0].transformer.filename",
    ]


# ------------------------------------------------------------------------------ v2


@pytest.mark.parametrize("name", BAD_NAMES)
def test_v2_session_file_escape(tmp_path: Path, name: str) -> None:
    doc = {
        "version": 2,
        "pipeline": {"sessions": {"x": {"file": name}}, "flow": [{"run": "x"}]},
    }
    exc = escape(write(tmp_path / "m", doc))
    assert paths(exc) == ["pipeline.sessions.x.file"]


def test_v2_custom_ops_library_escape(tmp_path: Path) -> None:
    doc = v2_decoder(session_options={"custom_ops_library": "../libevil.so"})
    exc = escape(write(tmp_path / "m", doc))
    assert paths(exc) == ["pipeline.sessions.decoder.session_options.custom_ops_library"]


def test_escaping_file_from_a_user_preset_is_caught_after_resolution(tmp_path: Path) -> None:
    presets = tmp_path / "presets"
    presets.mkdir()
    preset = {"pipeline": {"sessions": {"decoder": {"file": "../../evil.onnx"}}}}
    (presets / "sneaky.json").write_text(
        json.dumps({"extends": "autoregressive-decoder", **preset})
    )
    folder = write(tmp_path / "m", {"version": 2, "pipeline": {"extends": "sneaky"}})
    exc = escape(folder, preset_dirs=[presets])
    assert paths(exc) == ["pipeline.sessions.decoder.file"]


def test_names_inside_the_folder_are_fine(tmp_path: Path) -> None:
    spec = load(write(tmp_path, v2_decoder("sub/dir/../model.onnx")))
    assert spec.sessions["decoder"].file == "sub/dir/../model.onnx"


def test_metadata_is_free_form_and_never_checked(tmp_path: Path) -> None:
    doc = {**v2_decoder(), "metadata": {"file": "/not/opened.onnx"}}
    assert check_paths(doc, tmp_path, None) == []
    load(write(tmp_path, doc))


def test_empty_file_name_is_refused(tmp_path: Path) -> None:
    exc = escape(write(tmp_path, v2_decoder("")))
    assert "expected a file name" in str(exc)


# ------------------------------------------------------------------------------ symlinks


def _symlink(link: Path, target: Path) -> None:
    try:
        os.symlink(target, link)
    except (OSError, NotImplementedError):
        pytest.skip("this filesystem cannot create symlinks")


def test_symlinked_file_escaping_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.onnx").write_bytes(b"")
    folder = write(tmp_path / "m", v2_decoder("model.onnx"))
    _symlink(folder / "model.onnx", outside / "secret.onnx")
    exc = escape(folder)
    assert paths(exc) == ["pipeline.sessions.decoder.file"]
    assert "outside the model folder" in str(exc)


def test_symlinked_folder_escaping_the_folder(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    folder = write(tmp_path / "m", v2_decoder("weights/model.onnx"))
    _symlink(folder / "weights", tmp_path / "outside")
    assert paths(escape(folder)) == ["pipeline.sessions.decoder.file"]


def test_symlink_staying_inside_is_fine(tmp_path: Path) -> None:
    folder = write(tmp_path / "m", v2_decoder("alias.onnx"))
    (folder / "real.onnx").write_bytes(b"")
    _symlink(folder / "alias.onnx", folder / "real.onnx")
    assert load(folder).sessions["decoder"].file == "alias.onnx"


# ------------------------------------------------------------------------------ root


def _target_with_sibling_draft(tmp_path: Path) -> Path:
    doc = v2_decoder()
    doc["pipeline"]["extends"] = "speculative-draft-target"
    doc["pipeline"]["sessions"]["draft"] = {"file": "../draft/model.onnx"}
    return write(tmp_path / "target", doc)


def test_sibling_folder_needs_an_explicit_root(tmp_path: Path) -> None:
    target = _target_with_sibling_draft(tmp_path)
    assert paths(escape(target)) == ["pipeline.sessions.draft.file"]
    assert "pass an explicit root" in str(escape(target))


def test_root_widening_allows_a_sibling_folder(tmp_path: Path) -> None:
    spec = load(_target_with_sibling_draft(tmp_path), root=tmp_path)
    assert spec.sessions["draft"].file == "../draft/model.onnx"
    assert spec.strategy.draft_session == "draft"


def test_root_widening_stops_at_the_root(tmp_path: Path) -> None:
    folder = write(tmp_path / "a" / "target", v2_decoder("../../../elsewhere.onnx"))
    assert paths(escape(folder, root=tmp_path / "a")) == ["pipeline.sessions.decoder.file"]


def test_resolve_inside(tmp_path: Path) -> None:
    assert resolve_inside(tmp_path, "m.onnx", None, "x") == (tmp_path / "m.onnx").resolve()
    with pytest.raises(PathEscapeError) as info:
        resolve_inside(tmp_path, "../m.onnx", None, "pipeline.sessions.d.file")
    assert paths(info.value) == ["pipeline.sessions.d.file"]


# ------------------------------------------------------------------------------ native code


def _decoder_folder(tmp_path: Path, **session: Any) -> Path:
    tiny_models.decoder(tmp_path / "model.onnx")
    return write(tmp_path, v2_decoder(**session))


def test_tiny_decoder_loads_without_trust(tmp_path: Path) -> None:
    """The control: the same folder without a library loads."""
    assert Model(_decoder_folder(tmp_path)).route.kind == "decoder"


def test_custom_ops_library_needs_trust(tmp_path: Path) -> None:
    folder = _decoder_folder(tmp_path, session_options={"custom_ops_library": "libcustom_ops.so"})
    load(folder)  # the config itself is valid: refusing the code is the model's job
    with pytest.raises(TrustError) as info:
        Model(folder, trust_remote_code=False)
    assert "custom_ops_library" in str(info.value)
    assert "trust_remote_code=True" in str(info.value)


def test_custom_ops_library_overlaid_on_the_2layer_model_needs_trust(
    smollm2_2layers_dir: Path,
) -> None:
    """A v1 builder config with a library added by overlay (the shared folder stays as is)."""
    config = Config(smollm2_2layers_dir)
    options = {"log_id": "x", "custom_ops_library": "libcustom_ops.so"}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    assert config.spec.sessions["decoder"].options.custom_ops_library == "libcustom_ops.so"
    with pytest.raises(TrustError, match=r"libcustom_ops\.so"):
        Model(config, trust_remote_code=False)


def test_plugin_needs_trust(tmp_path: Path) -> None:
    tiny_models.decoder(tmp_path / "model.onnx")
    doc = v2_decoder()
    doc["pipeline"]["plugin"] = {"library": "libmy_pipeline.so", "entry_point": "Create"}
    with pytest.raises(TrustError) as info:
        Model(write(tmp_path, doc))
    assert "libmy_pipeline.so" in str(info.value)


def test_trusted_missing_custom_ops_library_is_a_model_error(tmp_path: Path) -> None:
    folder = _decoder_folder(tmp_path, session_options={"custom_ops_library": "libmissing.so"})
    with pytest.raises(ModelError, match=r"libmissing\.so"):
        Model(folder, trust_remote_code=True)
