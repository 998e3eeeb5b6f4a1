"""Every KV-cache layout of the same tiny decoder against a NumPy recompute with no cache: greedy
tokens and per-step logits, batch 1 and batch 3 with uneven right-padded prompts, rewinds, a
generated pad token, sliding windows, in-place buffers, and the errors at the edges."""

from __future__ import annotations

import json
import warnings

import layouts as L
import numpy as np
import pytest

import genai_runtime as og
from genai_runtime.errors import ConfigError, GenerationError, ModelError
from genai_runtime.kv import CACHE_KINDS
from genai_runtime.kv.share_buffer import ShareBufferCache

ATOL = 1e-4
PROMPTS = [[5, 9, 3, 7, 12], [4, 8], [6, 2, 11, 13]]  # uneven: rows 1 and 2 are right-padded


@pytest.fixture(scope="module")
def w() -> dict[str, np.ndarray]:
    return L.weights()


@pytest.fixture(scope="module")
def models(tmp_path_factory, w) -> dict[str, og.Model]:
    root = tmp_path_factory.mktemp("layouts")
    return {layout: og.Model(L.folder(root, layout, w)) for layout in L.LAYOUTS}


def _generator(model: og.Model, **options) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**options)
    return og.Generator(model, params)


def _padded(prompts: list[list[int]]) -> np.ndarray:
    width = max(map(len, prompts))
    return np.array([p + [L.PAD] * (width - len(p)) for p in prompts], np.int64)


def _rows(generator: og.Generator, prompts: list[list[int]]) -> list[list[int]]:
    """Each row's real tokens: its prompt without padding, then what was generated."""
    width = max(map(len, prompts))
    return [p + generator.get_sequence(b)[width:].tolist() for b, p in enumerate(prompts)]


def _step_and_check(generator, prompts, w, steps, window=None, window_layers=()) -> None:
    """Generate ``steps`` tokens; before each, the logits of every row equal the recompute."""
    for _ in range(steps):
        logits = generator.get_logits()[:, 0]
        for b, tokens in enumerate(_rows(generator, prompts)):
            ref = L.reference_logits(tokens, w, window, window_layers)[-1]
            np.testing.assert_allclose(logits[b], ref, atol=ATOL, rtol=0)
        generator.generate_next_token()
        assert generator.get_next_tokens().tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("layout", L.LAYOUTS)
def test_batch1_greedy_equals_recompute_without_cache(models, w, layout) -> None:
    generator = _generator(models[layout], max_length=L.CAPACITY)
    assert generator.kv_plan.kind == layout
    generator.append_tokens(PROMPTS[0])
    cache = generator.kv_cache
    _step_and_check(generator, PROMPTS[:1], w, 3)
    if layout != "concat":  # written in place: the same buffers every step, no copies
        before = [a.__array_interface__["data"][0] for a in cache._arrays]
    _step_and_check(generator, PROMPTS[:1], w, L.CAPACITY - len(PROMPTS[0]) - 4)
    if layout != "concat":
        assert [a.__array_interface__["data"][0] for a in cache._arrays] == before
    per_token = 2 * L.LAYERS * L.KV_HEADS * L.HEAD * 4
    assert cache.nbytes >= cache.length * per_token
    assert cache.capacity >= cache.length == generator.token_count() - 1


@pytest.mark.parametrize("layout", L.LAYOUTS)
def test_batch3_uneven_prompts_equal_recompute(models, w, layout) -> None:
    generator = _generator(models[layout], max_length=L.CAPACITY, batch_size=3)
    generator.append_tokens(_padded(PROMPTS))
    _step_and_check(generator, PROMPTS, w, 12)


@pytest.mark.parametrize("layout", L.LAYOUTS)
@pytest.mark.parametrize("batch", [1, 3])
def test_rewind_to_the_middle_then_generate(models, w, layout, batch) -> None:
    prompts = PROMPTS[:batch]
    generator = _generator(models[layout], max_length=L.CAPACITY, batch_size=batch)
    generator.append_tokens(_padded(prompts))
    _step_and_check(generator, prompts, w, 10)
    middle = generator.token_count() - 6
    generator.rewind_to(middle)
    # Steer away from what was generated before, so stale cache rows would show.
    logits = generator.get_logits()[:, 0]
    forced = np.where(np.arange(L.VOCAB) == (logits.argmax(-1)[:, None] + 1) % 30, 50.0, 0.0)
    generator.set_logits(forced.astype(np.float32))
    generator.generate_next_token()
    _step_and_check(generator, prompts, w, 8)


@pytest.mark.parametrize("layout", L.LAYOUTS)
@pytest.mark.parametrize("batch", [1, 3])
def test_a_generated_pad_token_does_not_stall_the_cache(models, w, layout, batch) -> None:
    prompts = PROMPTS[:batch]
    generator = _generator(models[layout], max_length=L.CAPACITY, batch_size=batch)
    generator.append_tokens(_padded(prompts))
    _step_and_check(generator, prompts, w, 2)
    pad = np.full((batch, L.VOCAB), -50.0, np.float32)
    pad[:, L.PAD] = 50.0
    generator.get_logits()
    generator.set_logits(pad)
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [L.PAD] * batch
    _step_and_check(generator, prompts, w, 6)


def test_static_scatter_capacity_is_a_clear_error_and_the_generator_survives(tmp_path, w):
    folder = L.folder(tmp_path, "static-scatter", w)
    doc = json.loads((folder / "genai_config.json").read_text())
    doc["search"]["max_length"] = L.CAPACITY + 8  # longer than the graph's max_seq_len
    (folder / "genai_config.json").write_text(json.dumps(doc))
    generator = _generator(og.Model(folder))
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, L.CAPACITY - len(PROMPTS[0]))
    with pytest.raises(GenerationError, match="max_seq_len 24"):
        generator.generate_next_token()
        generator.get_logits()
    generator.rewind_to(10)
    _step_and_check(generator, PROMPTS[:1], w, 5)


@pytest.mark.parametrize("layout", [x for x in L.LAYOUTS if x not in L.FIXED_SHAPE])
@pytest.mark.parametrize(("window", "layers"), [(4, [0]), (3, [])])
def test_sliding_window_past_the_window_equals_windowed_attention(
    tmp_path, w, layout, window, layers
) -> None:
    # cache_slack 2: the share-buffer graph's windowed layers keep window + 2 rows and evict.
    folder = L.folder(tmp_path, layout, w, window=window, window_layers=layers, cache_slack=2)
    model = og.Model(folder)
    # GroupQueryAttention's sliding_window_cache refuses right-padded prompts (seqlens_k below
    # the prompt width), so that graph gets an even batch; the others take the uneven one.
    even = [PROMPTS[0], PROMPTS[2] + [14], PROMPTS[1] + [3, 1, 9]]
    for batch in (1, 3):
        prompts = (even if layout == "share-buffer" else PROMPTS)[:batch]
        generator = _generator(model, max_length=20, batch_size=batch)
        if layout == "share-buffer":
            assert generator.kv_plan.kind == "sliding-window"
            assert generator.kv_cache.window_capacity == window + 2
        generator.append_tokens(_padded(prompts))
        _step_and_check(generator, prompts, w, 12, window, layers)
        if layout == "share-buffer":
            assert generator.kv_cache.evicted


def test_sliding_window_rewind_works_until_rows_are_evicted(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "share-buffer", w, window=4, window_layers=[0], cache_slack=2)
    generator = _generator(og.Model(folder), max_length=20)
    short = [PROMPTS[0][:3]]
    generator.append_tokens(short[0])
    _step_and_check(generator, short, w, 2, 4, [0])
    generator.rewind_to(4)  # 5 tokens seen, capacity 6: nothing evicted yet
    _step_and_check(generator, short, w, 6, 4, [0])
    assert generator.kv_cache.evicted
    sequence = generator.get_sequence(0).tolist()
    with pytest.raises(GenerationError, match="evicted"):
        generator.rewind_to(6)
    assert generator.get_sequence(0).tolist() == sequence  # refused: nothing changed
    _step_and_check(generator, short, w, 2, 4, [0])  # and generation carries on
    generator.rewind_to(0)
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, 3, 4, [0])


def test_share_buffer_first_chunk_holds_the_local_window(tmp_path, w) -> None:
    # GroupQueryAttention refuses a buffer shorter than local_window_size, even when unused.
    model = og.Model(L.folder(tmp_path, "share-buffer", w, window=32, window_layers=[1]))
    layout = model.plan.layout
    cache = ShareBufferCache(layout, 1, 12)
    cache.reserve(5)
    assert cache.capacity == 32
    generator = _generator(model, max_length=12)  # the sliding-window kind: same rule
    generator.append_tokens(PROMPTS[0])
    assert generator.kv_cache.window_capacity == 32
    _step_and_check(generator, PROMPTS[:1], w, 6)


def test_share_buffer_compaction_moves_the_kept_rows_in_place(tmp_path, w) -> None:
    # A token tree keeps one path of what a pass wrote: those rows move down, in order.
    model = og.Model(L.folder(tmp_path, "share-buffer", w))
    cache = ShareBufferCache(model.plan.layout, 1, 12)
    cache.reserve(8)
    for array in cache._arrays:
        array[...] = np.arange(array.shape[2])[None, None, :, None]
    cache.length = 8
    cache.compact(3, np.array([4, 6]))
    assert cache.length == 5
    for array in cache._arrays:
        assert array[0, 0, :5, 0].tolist() == [0, 1, 2, 4, 6]


# -- bad input --------------------------------------------------------------------------------


def test_kv_hidden_mismatch_between_config_and_graph(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "static-scatter", w)
    doc = json.loads((folder / "genai_config.json").read_text())
    doc["model"]["decoder"]["num_key_value_heads"] = 4  # 4 x 8 = 32, the graph has 16
    (folder / "genai_config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=r"key_cache\.0.*kv_hidden 16.*= 32"):
        og.Model(folder)


def test_batch_beyond_a_static_batch_graph(tmp_path, w) -> None:
    folder = tmp_path / "static-batch"
    L.build("static-scatter", folder / "model.onnx", w, static_batch=1)
    (folder / "genai_config.json").write_text(json.dumps(L.config("static-scatter")))
    model = og.Model(folder)
    with pytest.raises(ModelError, match=r"fixes batch size 1; batch_size 2"):
        _generator(model, batch_size=2)
    generator = _generator(model, max_length=12)  # batch 1 still runs
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, 3)


def test_driver_inputs_on_a_4d_graph_fall_back_with_a_warning(tmp_path, w) -> None:
    """A concat graph that also takes write_indices / nonpad_kv_seqlen (here: ignored by the
    math) runs on the generic cache, with the drivers fed, after a warning."""
    folder = tmp_path / "concat-drivers"
    path = L.build("concat", folder / "model.onnx", w)
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    for name in ("write_indices", "nonpad_kv_seqlen"):
        model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, ["b"]))
        model.graph.output.append(
            helper.make_tensor_value_info(name + "_out", TensorProto.INT64, ["b"])
        )
        model.graph.node.append(helper.make_node("Identity", [name], [name + "_out"]))
    onnx.save(model, str(path))
    doc = L.config("concat")
    doc["model"]["decoder"]["inputs"]["write_indices"] = "write_indices"
    (folder / "genai_config.json").write_text(json.dumps(doc))
    loaded = og.Model(folder)
    with pytest.warns(RuntimeWarning, match="using the generic concat cache"):
        generator = _generator(loaded, max_length=16, batch_size=3)
    generator.append_tokens(_padded(PROMPTS))
    assert generator.get_output("write_indices_out").tolist() == [0, 0, 0]
    assert generator.get_output("nonpad_kv_seqlen_out").tolist() == [5, 5, 5]  # padded width
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _step_and_check(generator, PROMPTS, w, 3)
    assert generator.get_output("write_indices_out").tolist() == [6, 3, 5]  # prompt + 2 decodes ran
    assert generator.get_output("nonpad_kv_seqlen_out").tolist() == [7, 4, 6]


def _v2_static(kind: str, past: str, present: str) -> dict:
    names = {"input_ids": "input_ids", "position_ids": "position_ids"}
    return {
        "version": 2,
        "pipeline": {
            "extends": "autoregressive-decoder",
            "sessions": {"decoder": {"file": "model.onnx", "inputs": names}},
            "state": {
                "kv_cache": {
                    "kind": kind,
                    "past_key_pattern": past % "key",
                    "past_value_pattern": past % "value",
                    "present_key_pattern": present % "key",
                    "present_value_pattern": present % "value",
                    "write_indices": "write_indices",
                    "nonpad_kv_seqlen": "nonpad_kv_seqlen",
                    "num_kv_heads": L.KV_HEADS,
                    "head_size": L.HEAD,
                }
            },
        },
        "tokens": {"bos": 1, "eos": [L.EOS], "pad": L.PAD},
        "generation": {"do_sample": False, "max_length": L.CAPACITY},
    }


def test_v2_state_kv_cache_form_runs_static_scatter(tmp_path, w) -> None:
    folder = tmp_path / "v2"
    L.build("static-scatter", folder / "model.onnx", w)
    doc = _v2_static("static-scatter", "%s_cache.%%d", "updated_%s_cache.%%d")
    (folder / "genai_config.json").write_text(json.dumps(doc))
    generator = _generator(og.Model(folder), batch_size=3)
    assert generator.kv_plan.kind == "static-scatter"
    generator.append_tokens(_padded(PROMPTS))
    _step_and_check(generator, PROMPTS, w, 5)


def test_static_scatter_kind_on_a_4d_graph_is_a_config_error(tmp_path, w) -> None:
    folder = tmp_path / "v2-4d"
    L.build("concat", folder / "model.onnx", w)
    doc = _v2_static("static-scatter", "past_key_values.%%d.%s", "present.%%d.%s")
    doc["pipeline"]["sessions"]["decoder"]["inputs"]["attention_mask"] = "attention_mask"
    (folder / "genai_config.json").write_text(json.dumps(doc))
    model = og.Model(folder)
    with pytest.raises(ConfigError, match=r"kv_cache\.kind.*static-scatter needs scatter caches"):
        _generator(model)


def test_graph_scattered_blocks_give_the_same_logits(tmp_path, w) -> None:
    """BlockedKV: the graph reads its cache in 1, 2 or 4 blocks merged by an online softmax."""
    runs = {}
    for blocks in (1, 2, 4):
        model = og.Model(L.folder(tmp_path, "graph-scattered", w, blocks=blocks))
        generator = _generator(model, max_length=L.CAPACITY, batch_size=3)
        assert generator.kv_plan.kind == "graph-scattered"
        generator.append_tokens(_padded(PROMPTS))
        logits = []
        for _ in range(10):
            logits.append(generator.get_logits()[:, 0])
            generator.generate_next_token()
        runs[blocks] = np.stack(logits), generator.get_sequence(0).tolist()
    for blocks in (2, 4):
        np.testing.assert_allclose(runs[blocks][0], runs[1][0], atol=ATOL, rtol=0)
        assert runs[blocks][1] == runs[1][1]


def test_graph_scattered_block_count_must_divide_the_context(tmp_path, w) -> None:
    folder = tmp_path / "blocks"
    L.build("graph-scattered", folder / "model.onnx", w, blocks=4)
    doc = _v2_static("auto", "past_%s.%%d", "past_%s.%%d_RetainedState")
    kv = doc["pipeline"]["state"]["kv_cache"]
    del kv["write_indices"], kv["nonpad_kv_seqlen"]
    for blocks, ok in ((4, True), (5, False)):
        kv["num_kv_blocks"] = blocks
        (folder / "genai_config.json").write_text(json.dumps(doc))
        model = og.Model(folder)
        if ok:
            generator = _generator(model, batch_size=3)
            generator.append_tokens(_padded(PROMPTS))
            _step_and_check(generator, PROMPTS, w, 4)
        else:
            with pytest.raises(ConfigError, match=r"num_kv_blocks.*5 KV blocks do not divide.* 24"):
                _generator(model)


def test_graph_scattered_past_the_context_is_a_clear_error(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "graph-scattered", w)
    doc = json.loads((folder / "genai_config.json").read_text())
    doc["search"]["max_length"] = L.CAPACITY + 4
    (folder / "genai_config.json").write_text(json.dumps(doc))
    generator = _generator(og.Model(folder))
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, L.CAPACITY - len(PROMPTS[0]))
    generator.get_logits()  # the 24th position still fits
    generator.generate_next_token()
    with pytest.raises(GenerationError, match="fixed context of 24"):
        generator.get_logits()
    generator.rewind_to(8)
    _step_and_check(generator, PROMPTS[:1], w, 4)


# -- fixed-shape caches ------------------------------------------------------------------------


def test_fixed_shape_prompt_runs_in_fixed_chunks_with_aligned_masks(tmp_path, w) -> None:
    """A 5-token prompt is two 4-token chunks; masks are left- (index-copy) or right-aligned
    (FIFO) over the past, with the chunk's own padding right or left."""
    for layout, padded_left in (("static-index-copy", False), ("static-fifo", True)):
        generator = _generator(og.Model(L.folder(tmp_path, layout, w, ctx=8)), max_length=8)
        assert generator.kv_plan.kind == layout
        generator.append_tokens(PROMPTS[0])  # 5 tokens: a full chunk, then 1 + 3 pads
        cache = generator.kv_cache
        assert cache.valid.tolist() == [5] and cache.rows.tolist() == [1]
        new = [1, 0, 0, 0] if not padded_left else [0, 0, 0, 1]
        past = [1, 1, 1, 1, 0, 0, 0, 0] if not padded_left else [0, 0, 0, 0, 1, 1, 1, 1]
        assert cache.mask[0].tolist() == past + new
        assert cache.ids[0].tolist() == ([12, 0, 0, 0] if not padded_left else [0, 0, 0, 12])
        if layout == "static-index-copy":
            assert cache.cache_position[0].tolist() == [4, 5, 6, 7]
        else:
            assert cache.position_ids[0].tolist() == [0, 0, 0, 4]
        _step_and_check(generator, PROMPTS[:1], w, 2)


def test_static_fifo_past_its_context_equals_sliding_attention(tmp_path, w) -> None:
    """Past the fixed context the FIFO drops the oldest rows: each decoded token sees the last
    ctx positions and itself, a window of ctx + 1."""
    ctx = 8
    model = og.Model(L.folder(tmp_path, "static-fifo", w, ctx=ctx))
    for batch in (1, 3):
        prompts = PROMPTS[:batch]
        generator = _generator(model, max_length=24, batch_size=batch)
        generator.append_tokens(_padded(prompts))
        _step_and_check(generator, prompts, w, 14, window=ctx + 1)
        assert generator.kv_cache.evicted


def test_static_fifo_rewinds_until_rows_are_dropped(tmp_path, w) -> None:
    ctx = 8
    generator = _generator(og.Model(L.folder(tmp_path, "static-fifo", w, ctx=ctx)), max_length=24)
    short = [PROMPTS[0][:3]]
    generator.append_tokens(short[0])
    _step_and_check(generator, short, w, 4)  # 6 rows held of 8
    generator.rewind_to(4)
    assert generator.kv_cache.valid.tolist() == [3]  # the last kept token runs again next
    _step_and_check(generator, short, w, 8, window=ctx + 1)
    assert generator.kv_cache.evicted
    sequence = generator.get_sequence(0).tolist()
    with pytest.raises(GenerationError, match="dropped older ones"):
        generator.rewind_to(6)
    assert generator.get_sequence(0).tolist() == sequence  # refused: nothing changed
    _step_and_check(generator, short, w, 2, window=ctx + 1)  # and generation carries on
    generator.rewind_to(0)
    generator.append_tokens(PROMPTS[2])
    _step_and_check(generator, PROMPTS[2:], w, 4)


def test_static_index_copy_past_its_context_is_a_clear_error(tmp_path, w) -> None:
    ctx = 8
    model = og.Model(L.folder(tmp_path, "static-index-copy", w, ctx=ctx))
    generator = _generator(model, max_length=16, batch_size=3)
    generator.append_tokens(_padded(PROMPTS))
    _step_and_check(generator, PROMPTS, w, 3)  # row 0 now holds 8 rows: the context is full
    generator.generate_next_token()
    with pytest.raises(GenerationError, match=r"after 8 \(row 0\) exceed .* fixed context of 8"):
        generator.get_logits()
    assert generator.kv_cache.valid.tolist() == [8, 5, 7]  # nothing was written
    generator.rewind_to(6)
    _step_and_check(generator, PROMPTS, w, 2)


def test_fixed_shape_kinds_must_fit_the_graph(tmp_path, w) -> None:
    folder = tmp_path / "forced"
    L.build("static-fifo", folder / "model.onnx", w)
    doc = L.config("static-fifo")
    doc["model"]["decoder"]["inputs"].pop("attention_mask")
    for kind, graph, ok in (
        ("static-index-copy", "static-fifo", True),  # alignment is the config's call
        ("concat", "static-fifo", False),
        ("static-fifo", "concat", False),
    ):
        L.build(graph, folder / "model.onnx", w)
        v2 = _v2_static(kind, "past_key_values.%%d.%s", "present.%%d.%s")
        kv = v2["pipeline"]["state"]["kv_cache"]
        del kv["write_indices"], kv["nonpad_kv_seqlen"]
        v2["pipeline"]["sessions"]["decoder"]["inputs"]["attention_mask"] = "attention_mask"
        (folder / "genai_config.json").write_text(json.dumps(v2))
        model = og.Model(folder)
        if ok:
            assert _generator(model).kv_plan.kind == kind
        else:
            with pytest.raises(ConfigError, match=r"kv_cache\.kind"):
                _generator(model)


def test_sliding_window_read_from_the_graph_when_the_config_is_silent(tmp_path, w) -> None:
    """No decoder.sliding_window in the config: GroupQueryAttention's local_window_size says
    which layers slide and how far (read from the .onnx file's nodes)."""
    folder = L.folder(tmp_path, "share-buffer", w, window=4, window_layers=[0])
    doc = json.loads((folder / "genai_config.json").read_text())
    del doc["model"]["decoder"]["sliding_window"]
    (folder / "genai_config.json").write_text(json.dumps(doc))
    generator = _generator(og.Model(folder), max_length=20)
    assert generator.kv_plan.kind == "sliding-window"
    layout = generator.kv_plan.layout
    assert (layout.window, layout.window_layers) == (4, (0,))
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, 12, 4, [0])
    assert generator.kv_cache.window_capacity == 4 + 16  # the reference's default slack


def test_onnx_scan_reads_every_node_attribute_the_onnx_package_sees(tmp_path, w) -> None:
    import onnx

    from genai_runtime.session.onnx_scan import int_attributes

    path = L.build("share-buffer", tmp_path / "m.onnx", w, window=3, window_layers=[1])
    expected = [
        (list(node.input), next(a.i for a in node.attribute if a.name == "local_window_size"))
        for node in onnx.load(str(path)).graph.node
        if node.op_type == "GroupQueryAttention"
    ]
    assert int_attributes(path, "GroupQueryAttention", "local_window_size") == expected
    assert [size for _, size in expected] == [-1, 3]
    (tmp_path / "bad.onnx").write_bytes(path.read_bytes()[:1000])  # truncated: nothing, no crash
    assert int_attributes(tmp_path / "bad.onnx", "GroupQueryAttention", "local_window_size") == []


def test_fixed_shape_targets_refuse_speculation_and_all_position_logits(tmp_path, w) -> None:
    folder = L.folder(tmp_path, "static-fifo", w)
    generator = _generator(og.Model(folder), max_length=16)
    generator.append_tokens(PROMPTS[0])
    with pytest.raises(ModelError, match="fixed chunks"):
        generator._exec.pass_logits()
    doc = json.loads((folder / "genai_config.json").read_text())
    doc["speculative"] = {"ngram_size": 3, "max_draft_tokens": 3}
    (folder / "genai_config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="fixed chunks of 4 tokens"):
        og.Model(folder)


@pytest.mark.parametrize("layout", L.FIXED_SHAPE)
def test_fixed_shape_second_turn_runs_in_chunks(tmp_path, w, layout) -> None:
    """A multi-token append after generation (a chat turn) is chunked like a prompt."""
    generator = _generator(og.Model(L.folder(tmp_path, layout, w)), max_length=L.CAPACITY)
    generator.append_tokens(PROMPTS[0])
    _step_and_check(generator, PROMPTS[:1], w, 3)
    turn = [7, 3, 11, 2, 9, 4]  # 6 tokens (+ the pending one): two chunks of 4
    generator.append_tokens(turn)
    tokens = generator.get_sequence(0).tolist()
    ref = L.reference_logits(tokens, w)[-1]
    np.testing.assert_allclose(generator.get_logits()[0, 0], ref, atol=ATOL, rtol=0)
    generator.generate_next_token()
    assert generator.get_next_tokens().tolist() == [int(np.argmax(ref))]


def test_speculation_refuses_a_cache_kind_that_cannot_rewind(tmp_path, w) -> None:
    # The windowed layers evict, so rejected drafts could not be rewound past the window: the
    # kind declares it, and check_rewind refuses the target though "auto" chose the kind.
    folder = L.folder(tmp_path, "share-buffer", w, window=4, window_layers=[0], cache_slack=2)
    doc = json.loads((folder / "genai_config.json").read_text())
    doc["speculative"] = {"ngram_size": 3, "max_draft_tokens": 3}
    (folder / "genai_config.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"'sliding-window' \(chosen by auto\) evicts and cannot"):
        og.Model(folder)
    cannot = {kind for kind, cls in CACHE_KINDS.items() if not cls.can_rewind}
    assert cannot == {"sliding-window", "static-fifo"}  # the two that evict
