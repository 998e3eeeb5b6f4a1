"""``explain`` names the cache kind and why it was chosen; ``bench`` reports the cache's bytes."""

from __future__ import annotations

import json
import shutil

import layouts as L
import pytest
from conftest import require_shared

from genai_runtime.cli import main


def _explain(capsys, folder) -> dict:
    assert main(["explain", str(folder), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_explain_static_scatter_names_kind_reason_and_drivers(capsys) -> None:
    folder = require_shared("fixtures", "onnxruntime-genai", "static-scatter-bias-decoder")
    kv = _explain(capsys, folder)["graphs"]["kv_cache"]
    assert kv["kind"] == "static-scatter"
    assert "write_indices / nonpad_kv_seqlen" in kv["reason"]
    assert kv["drivers"] == {
        "write_indices": "write_indices",
        "nonpad_kv_seqlen": "nonpad_kv_seqlen",
    }
    assert kv["static_capacity"] == 16
    assert main(["explain", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "kind:      static-scatter (" in text and "capacity:  16 tokens" in text


def test_explain_sliding_window(capsys, tmp_path) -> None:
    folder = L.folder(tmp_path, "share-buffer", L.weights(), window=4, window_layers=[0])
    kv = _explain(capsys, folder)["graphs"]["kv_cache"]
    assert kv["kind"] == "sliding-window"
    assert "4-token sliding window on layers [0]" in kv["reason"]
    assert kv["window"] == 4 and kv["window_layers"] == [0]


@pytest.mark.parametrize(("share", "kind"), [(True, "share-buffer"), (False, "concat")])
def test_bench_reports_cache_bytes(capsys, tmp_path, share, kind) -> None:
    source = require_shared("models", "smollm2-135m-instruct-int4-2layers")
    folder = tmp_path / "m"
    folder.mkdir()
    for item in source.iterdir():
        if item.name != "genai_config.json":
            shutil.copy(item, folder / item.name)
    doc = json.loads((source / "genai_config.json").read_text())
    doc["search"]["past_present_share_buffer"] = share
    (folder / "genai_config.json").write_text(json.dumps(doc))
    args = ["bench", str(folder), "--runs", "1", "--warmup", "0", "--new-tokens", "8", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    kv = report["kv_cache"]
    # 2 layers x (key + value) x 3 KV heads x 64 x fp32 per token; the last token is not run yet.
    per_token = 2 * 2 * 3 * 64 * 4
    assert kv["kind"] == kind and kv["length"] == report["prompt_tokens"] + 8 - 1
    # share-buffer maps capacity lazily and counts the bytes held; concat allocates its length.
    expected = kv["length"] * per_token
    assert kv["nbytes"] == expected
    if share:
        assert kv["capacity"] >= kv["length"]


@pytest.mark.parametrize(
    ("layout", "why"),
    [("static-index-copy", "'cache_position' input"), ("static-fifo", "FIFO order")],
)
def test_explain_fixed_shape_kinds(capsys, tmp_path, layout, why) -> None:
    folder = L.folder(tmp_path, layout, L.weights(), ctx=8)
    kv = _explain(capsys, folder)["graphs"]["kv_cache"]
    assert kv["kind"] == layout
    assert "past fixed at 8 positions, 4 new rows out" in kv["reason"] and why in kv["reason"]
