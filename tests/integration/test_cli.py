"""The ``genai-runtime`` command line on real model folders: validate, explain, migrate, run, bench.

Most cases call ``main(argv)`` in-process for speed; a few go through ``python -m genai_runtime``
to cover the real entry point, exit statuses and streams.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import _shared_root, require_shared

from genai_runtime import Model
from genai_runtime.cli import V2_SCHEMA_NAME, main
from genai_runtime.config import load
from genai_runtime.explain import explain_model, explain_spec, format_report

STATS = re.compile(
    r"prompt tokens: (\d+) \| prefill: ([\d.]+) tok/s \| decode: ([\d.]+) tok/s .*"
    r"time to first token: ([\d.]+) ms"
)


def cli(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m genai_runtime ARGS`` and capture its text output."""
    return subprocess.run(
        [sys.executable, "-m", "genai_runtime", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def run_main(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def copy_folder(src: Path, dst: Path) -> Path:
    """A real copy (never hard links: onnx refuses multiply-linked external data)."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    return dst


def edit_config(folder: Path, edit) -> None:
    path = folder / "genai_config.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


# ---------------------------------------------------------------------------------------------
# validate


def test_validate_smollm2_ok(capsys, smollm2_dir):
    code, out, err = run_main(capsys, "validate", smollm2_dir)
    assert code == 0, err
    first, kv = out.strip().splitlines()
    assert first == f"ok: {smollm2_dir} (v1, route decoder)"
    assert kv.startswith("kv cache: share-buffer (")


def test_validate_gpt2_ok_via_python_m(gpt2_dir):
    result = cli("validate", gpt2_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[0] == f"ok: {gpt2_dir} (v1, route decoder)"


def test_validate_yaml_config_file(capsys, gpt2_dir, tmp_path):
    folder = copy_folder(gpt2_dir, tmp_path / "gpt2")
    doc = json.loads((folder / "genai_config.json").read_text())
    (folder / "genai_config.json").unlink()
    (folder / "genai_config.yaml").write_text(yaml.safe_dump(doc))
    code, out, err = run_main(capsys, "validate", folder / "genai_config.yaml")
    assert code == 0, err
    assert "(v1, route decoder)" in out


def test_validate_lists_every_schema_error(smollm2_2layers_dir, tmp_path):
    folder = copy_folder(smollm2_2layers_dir, tmp_path / "m")

    def break_it(doc):
        doc["search"]["top_k"] = 1.5
        doc["search"]["max_length"] = "long"

    edit_config(folder, break_it)
    result = cli("validate", folder)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")
    lines = result.stderr.splitlines()
    assert "(2 problems)" in lines[0]
    # One line per problem, each with its JSON path and the bad value.
    assert any("search.top_k" in line and "1.5" in line for line in lines[1:])
    assert any("search.max_length" in line and '"long"' in line for line in lines[1:])
    assert result.stdout == ""


def test_validate_rejects_path_escape(capsys, smollm2_2layers_dir, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copyfile(smollm2_2layers_dir / "genai_config.json", folder / "genai_config.json")
    edit_config(folder, lambda d: d["model"]["decoder"].update(filename="../x.onnx"))
    for extra in ([], ["--config-only"]):
        code, _, err = run_main(capsys, "validate", folder, *extra)
        assert code == 1
        assert "model.decoder.filename" in err and "'../x.onnx'" in err
        assert "outside the model folder" in err


def test_validate_config_graph_mismatch_names_file_and_tensor(
    capsys, smollm2_2layers_dir, tmp_path
):
    folder = copy_folder(smollm2_2layers_dir, tmp_path / "m")
    edit_config(folder, lambda d: d["model"]["decoder"]["inputs"].update(attention_mask="attn"))
    code, out, err = run_main(capsys, "validate", folder)
    assert code == 1 and out == ""
    assert err.startswith("error: model.onnx:")
    assert "'attn'" in err and "attention_mask" in err
    # --config-only skips the graphs, so the same config passes.
    code, out, _ = run_main(capsys, "validate", folder, "--config-only")
    assert code == 0 and out.startswith("ok: ")


def test_validate_missing_model_file(capsys, smollm2_2layers_dir, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copyfile(smollm2_2layers_dir / "genai_config.json", folder / "genai_config.json")
    code, _, err = run_main(capsys, "validate", folder)
    assert code == 1
    assert "model file not found" in err and str(folder / "model.onnx") in err
    code, out, _ = run_main(capsys, "validate", folder, "--config-only")
    assert code == 0 and "(v1, route decoder)" in out


def test_validate_lists_every_missing_file(capsys, fixtures_dir):
    folder = fixtures_dir / "examples-pipeline-config" / "03-vlm-per-image"
    code, _, err = run_main(capsys, "validate", folder)
    assert code == 1
    missing = [line for line in err.splitlines() if "model file not found" in line]
    assert len(missing) == 3  # vision, embedding, decoder: all listed, not just the first


def test_validate_root_allows_sibling_folders(capsys, fixtures_dir):
    target = fixtures_dir / "speculative-tiny" / "target"
    code, _, err = run_main(capsys, "validate", target)
    assert code == 1 and "pass an explicit root" in err
    code, out, err = run_main(capsys, "validate", target, "--root", target.parent)
    assert code == 0, err
    assert "(v2, route speculative)" in out


def test_usage_errors_exit_2(capsys):
    assert main(["validate"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["run", "somewhere"]) == 2  # -p (or --audio) is required
    assert main(["run", "m", "-p", "x", "--max-length", "9", "--max-new-tokens", "3"]) == 2
    assert main(["bench", "m", "--runs", "0"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_no_traceback_for_runtime_errors(tmp_path):
    result = cli("run", tmp_path / "nowhere", "-p", "hi")
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# explain


def test_explain_smollm2(smollm2_dir):
    result = cli("explain", smollm2_dir)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert re.search(r"^route: decoder$", text, re.M)
    assert "single autoregressive decoder" in text
    assert "presets: autoregressive-decoder" in text
    assert re.search(r"decoder: file model\.onnx; phase step; .*providers cpu", text)
    assert re.search(r"input_ids\s+int64\[.*<- role input_ids", text)
    assert "60 KV inputs" in text
    assert re.search(r"format:\s+separate", text)
    assert re.search(r"layers:\s+30$", text, re.M)
    assert re.search(r"heads:\s+3 ", text)
    assert re.search(r"head size:\s+64$", text, re.M)
    assert re.search(r"kind:\s+share-buffer \(.*past_present_share_buffer", text)
    assert "past_present_share_buffer true" in text  # a generation setting off its default


def test_explain_gpt2_combined_concat(capsys, gpt2_dir):
    code, text, err = run_main(capsys, "explain", gpt2_dir)
    assert code == 0, err
    assert re.search(r"format:\s+combined \[2, B, H, S, D\]", text)
    assert re.search(r"kind:\s+concat \(", text)
    assert re.search(r"layers:\s+5$", text, re.M)


def test_explain_json(capsys, smollm2_2layers_dir, gpt2_dir):
    code, out, _ = run_main(capsys, "explain", smollm2_2layers_dir, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["version"] == 1 and report["route"]["kind"] == "decoder"
    assert report["route"]["reasons"]
    kv = report["graphs"]["kv_cache"]
    assert (kv["kind"], kv["num_layers"], kv["num_kv_heads"], kv["head_size"]) == (
        "share-buffer",
        2,
        3,
        64,
    )
    sources = {i["name"]: i["source"] for i in report["graphs"]["stages"][0]["inputs"]}
    assert sources["input_ids"] == "role" and sources["past_key_values.1.value"] == "kv"
    code, out, _ = run_main(capsys, "explain", gpt2_dir, "--json")
    kv = json.loads(out)["graphs"]["kv_cache"]
    assert (kv["format"], kv["kind"]) == ("combined", "concat")


def test_explain_pipeline_shows_wires_and_user_inputs(capsys, fixtures_dir):
    code, text, _ = run_main(capsys, "explain", fixtures_dir / "phi3-v")
    assert code == 0
    assert "route: multimodal" in text
    assert re.search(r"init:\s+vision \[loop=per_image\]", text)
    assert "vision.image_features -> embedding.image_features" in text
    assert re.search(r"pixel_values\s+float16\[.*<- user-supplied", text)
    assert re.search(r"inputs_embeds\s+.*<- wire embedding\.inputs_embeds", text)


def test_explain_config_only_and_missing_files(capsys, fixtures_dir, smollm2_2layers_dir):
    code, text, _ = run_main(capsys, "explain", smollm2_2layers_dir, "--config-only")
    assert code == 0
    assert "stages:" not in text and "graphs: not inspected (--config-only)" in text
    assert "kv cache (configured):" in text
    folder = fixtures_dir / "examples-pipeline-config" / "02-explicit-encoder-decoder"
    code, text, _ = run_main(capsys, "explain", folder)
    assert code == 0  # explain describes what it can; validate is the checker
    assert "route: encoder-decoder" in text
    assert "decoder [cross_attention_from=encoder]" in text
    assert "graphs: not inspected (" in text and "model file not found" in text


def test_explain_functions_on_loaded_model(gpt2_dir):
    model = Model(gpt2_dir)
    report = explain_model(model, version=1)
    assert report == explain_spec(model.spec, pipeline=model.pipeline, version=1)
    assert report["graphs"]["kv_cache"]["kind"] == "concat"
    assert report["generation"] == {"max_length": 512}
    assert "route: decoder" in format_report(report)


# ---------------------------------------------------------------------------------------------
# migrate


def _all_configs() -> list[Path]:
    root = _shared_root()
    folders = [root / "fixtures" / "onnxruntime-genai", root / "models"]
    return sorted(p.parent for f in folders if f.exists() for p in f.rglob("genai_config.json"))


def _config_id(folder: Path) -> str:
    return str(folder.relative_to(_shared_root()))


@pytest.mark.parametrize("source", _all_configs(), ids=_config_id)
def test_migrate_output_validates(capsys, tmp_path, source):
    require_shared(_config_id(source))
    spec_dir = source.parent.name == "speculative-tiny"
    # Configs naming files in sibling folders travel with their parent, checked with --root.
    base = source.parent if spec_dir else source
    copy = copy_folder(base, tmp_path / base.name)
    folder = copy / source.name if spec_dir else copy
    original_root = source.parent if spec_dir else None

    # Over the copied v1 file: --force, as migrate refuses to overwrite silently.
    code, _, err = run_main(
        capsys, "migrate", source, "-o", folder / "genai_config.json", "--force"
    )
    assert code == 0, err
    doc = json.loads((folder / "genai_config.json").read_text())
    assert next(iter(doc)) == "$schema" and doc["$schema"] == V2_SCHEMA_NAME
    assert doc["version"] == 2

    original = load(source, root=original_root)
    migrated = load(folder, root=copy if spec_dir else None)
    for field in (
        "sessions",
        "flow",
        "dataflow",
        "state",
        "roles",
        "strategy",
        "tokens",
        "generation",
        "plugin",
        "extends",
    ):
        assert getattr(migrated, field) == getattr(original, field), field

    files_present = all((source / s.file).is_file() for s in original.sessions.values())
    graph_args = [] if files_present else ["--config-only"]
    root_args = ["--root", copy] if spec_dir else []
    code, out, err = run_main(capsys, "validate", folder, *graph_args, *root_args)
    original_args = ["--root", original_root] if spec_dir else []
    expected, _, _ = run_main(capsys, "validate", source, *graph_args, *original_args)
    assert code == expected, err  # the migrated config is exactly as valid as the original
    if "version" not in json.loads((source / "genai_config.json").read_text()):
        assert code == 0, err  # every v1 config must migrate to a valid v2 one
        assert "(v2, route" in out


def test_migrate_stdout_is_normalised_and_idempotent(smollm2_2layers_dir, tmp_path):
    result = cli("migrate", smollm2_2layers_dir)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pipeline"]["extends"] == "autoregressive-decoder"  # presets left unresolved
    again = tmp_path / "genai_config.json"
    again.write_text(result.stdout)
    assert json.loads(cli("migrate", again).stdout) == doc


# ---------------------------------------------------------------------------------------------
# run / bench


def test_run_streams_text_and_stats(smollm2_2layers_dir):
    result = cli(
        "run", smollm2_2layers_dir, "-p", "Once upon a time", "--max-new-tokens", "8", "--greedy"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    match = STATS.search(result.stderr)
    assert match, result.stderr
    assert int(match[1]) > 0 and all(float(match[i]) > 0 for i in (2, 3, 4))
    assert "(8 new tokens)" in result.stderr


def test_run_chat_capital_of_france(smollm2_dir):
    result = cli(
        "run",
        smollm2_dir,
        "-p",
        "What is the capital of France?",
        "--chat",
        "--max-new-tokens",
        "10",
        "--greedy",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The capital of France is Paris")


def test_run_rejects_bad_search_option(capsys, smollm2_2layers_dir):
    code, _, err = run_main(capsys, "run", smollm2_2layers_dir, "-p", "x", "--top-p", "2")
    assert code == 1
    assert err.startswith("error: search option top_p")


def test_bench_json(smollm2_2layers_dir):
    result = cli("bench", smollm2_2layers_dir, "--runs", "2", "--new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_rss_mib"):
        assert isinstance(report[key], float) and report[key] > 0, key
    assert report["new_tokens"] == 8 and report["runs"] == 2
    assert report["prompt_tokens"] == 32
    # The builder's int4 export: 4-bit codes and an fp32 scale per block of 32, no zero points.
    weights = report["weights"]
    assert weights["bits_per_weight"] == 5.0 and weights["weight_bytes_per_token_mib"] > 0
    # 2 layers x (K, V) x 3 KV heads x 64 x fp32, at 512 tokens: 1.5 MiB
    assert weights["kv_bytes_at_512_mib"] == 1.5
    assert "gguf_bytes_per_token_mib" not in weights  # the builder's export has no GGUF source


def test_bench_text_with_prompt(capsys, smollm2_2layers_dir):
    code, out, _ = run_main(
        capsys,
        "bench",
        smollm2_2layers_dir,
        "--prompt",
        "hello world",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--new-tokens",
        "4",
    )
    assert code == 0
    assert re.search(r"decode:\s+[\d.]+ tok/s", out) and re.search(r"peak RSS:\s+[\d.]+ MiB", out)
