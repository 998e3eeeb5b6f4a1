"""Speculative decoding and controller plugins on real onnxruntime sessions.

Fixtures: the shared speculative-tiny target/draft pipelines, and tiny fp32 context decoders
built here (``tests/speculative_models.py``) next to a NumPy reference of the same math.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import speculative_models as sm
from scipy import stats

import genai_runtime as og
from genai_runtime.decoding.acceptance import accept
from genai_runtime.errors import ConfigError, GenerationError, ModelError, TrustError
from genai_runtime.speculative import AdaptiveK
from genai_runtime.speculative.proposers import NgramProposer

PROMPT = [1, 5, 9, 2, 7, 5, 9]


# --- helpers --------------------------------------------------------------------------------


def decode(model: og.Model, prompt, max_length: int | None = None, **search) -> og.Generator:
    params = og.GeneratorParams(model)
    if max_length:
        search["max_length"] = max_length
    if search:
        params.set_search_options(**search)
    gen = og.Generator(model, params)
    gen.append_tokens([list(prompt)])
    while not gen.is_done():
        gen.generate_next_token()
    return gen


def plain(folder: Path, root: Path | None = None) -> og.Model:
    config = og.Config(folder, root=root)
    config.overlay(json.dumps({"pipeline": {"strategy": {"kind": "standard"}}}))
    return og.Model(config)


def reference_greedy(prompt, emb, head, max_length: int, eos: int = sm.VOCAB - 1) -> list[int]:
    tokens = list(prompt)
    while len(tokens) < max_length:
        nxt = int(np.argmax(sm.reference_logits(np.array(tokens), emb, head)[-1]))
        tokens.append(nxt)
        if nxt == eos:
            break
    return tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """Target model.onnx, a noisy draft in draft/ (its own config) and draft.onnx beside."""
    folder = tmp_path_factory.mktemp("spec")
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    d_emb, d_head = sm.weights(7, noise=0.35)
    sm.context_decoder(folder / "draft.onnx", d_emb, d_head)
    sm.context_decoder(folder / "draft" / "model.onnx", d_emb, d_head)
    sm.write_config(folder / "draft", sm.decoder_config())
    sm.mtp_head(folder / "mtp.onnx", emb, head)
    sm.write_config(folder, sm.decoder_config())
    return folder


def variant(base: Path, tmp_path: Path, name: str, doc: dict) -> Path:
    """A config folder beside ``base``'s graphs (file names point back with ../)."""
    folder = tmp_path / name
    sm.write_config(folder, doc)
    return folder


def spec_config(strategy: dict, sessions: dict | None = None, **extra) -> dict:
    doc = sm.decoder_config(**extra)
    doc["pipeline"]["sessions"].update(sessions or {})
    doc["pipeline"]["strategy"] = {"kind": "speculative", **strategy}
    return doc


def with_config(folder: Path, doc: dict) -> og.Model:
    sm.write_config(folder, doc)
    return og.Model(folder)


# --- the tiny fixture is what the NumPy reference says ----------------------------------------


def test_context_decoder_matches_numpy_reference(tiny: Path) -> None:
    emb, head = sm.weights(0)
    gen = decode(og.Model(tiny), PROMPT)
    assert gen.get_sequence(0).tolist() == reference_greedy(PROMPT, emb, head, 48)


# --- greedy exactness -----------------------------------------------------------------------

STRATEGIES = {
    "draft-folder": {"draft": {"producer": "draft_model", "session": "draft"}},
    "draft-graph": {"draft": {"producer": "draft_model", "session": "draft1"}},
    "ngram": {"draft": {"producer": "ngram", "ngram_size": 2}, "num_speculative_tokens": 6},
    "fixed-k": {"draft": {"producer": "draft_model", "session": "draft", "adaptive": False}},
    # Fixed K: adaptive K weighs measured pass times, so on a loaded machine it may draft less
    # often, and this case counts the head's drafts.
    "hidden-state": {"draft": {"producer": "hidden_state", "session": "mtp", "adaptive": False}},
}
SESSIONS = {
    "draft": {"file": "draft/model.onnx"},
    "draft1": {"file": "draft.onnx"},
    "mtp": {"file": "mtp.onnx"},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("prompt", [PROMPT, [3, 3, 3, 3], [4, 8, 15, 16, 23, 4, 8]])
def test_greedy_speculation_is_token_for_token_plain_greedy(
    tiny: Path, name: str, prompt: list[int]
) -> None:
    doc = spec_config(STRATEGIES[name], SESSIONS)
    if name == "hidden-state":
        doc["pipeline"]["dataflow"] = [{"from": "decoder.hidden_states", "to": "mtp.prev_hidden"}]
    sm.write_config(tiny, doc)
    try:
        model = og.Model(tiny)
    finally:
        sm.write_config(tiny, sm.decoder_config())
    gen = decode(model, prompt)
    expected = reference_greedy(prompt, *sm.weights(0), 48)
    assert gen.get_sequence(0).tolist() == expected
    s = gen.get_speculative_stats()
    assert s["tokens"] == len(expected) - len(prompt)
    assert s["rounds"] < s["tokens"] or s["proposed"] == 0
    if name == "hidden-state":
        # The head extends the target's running sum exactly: what it drafts is accepted.
        assert s["proposed"] > 10 and s["acceptance_rate"] == 1.0


def test_hidden_state_proposer_reads_the_wire(tiny: Path, tmp_path: Path) -> None:
    """Fed zeros instead of the target's hidden state, the same head is mostly rejected."""
    emb, head = sm.weights(0)
    folder = tmp_path / "zeros"
    sm.context_decoder(folder / "model.onnx", emb, head)
    sm.mtp_head(folder / "mtp.onnx", emb, head)
    doc = spec_config(STRATEGIES["hidden-state"], {"mtp": {"file": "mtp.onnx"}})
    doc["pipeline"]["dataflow"] = [{"from": "decoder.hidden_states", "to": "mtp.prev_hidden"}]
    model = with_config(folder, doc)
    wired = decode(model, PROMPT).get_speculative_stats()["acceptance_rate"]
    gen = og.Generator(model, og.GeneratorParams(model))
    gen.append_tokens([PROMPT])
    proposer = gen._driver.proposer
    original = proposer.propose

    def unwired(context, k):
        if proposer.hidden is not None:
            proposer.hidden = np.zeros_like(proposer.hidden)
        return original(context, k)

    proposer.propose = unwired
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == decode(model, PROMPT).get_sequence(0).tolist()
    assert gen.get_speculative_stats()["acceptance_rate"] < 0.5 < wired


def test_speculative_tiny_target_with_its_draft(fixtures_dir: Path) -> None:
    root = fixtures_dir / "speculative-tiny"
    reference = plain(root / "target", root)
    for folder in ("target", "target-tree"):
        model = og.Model(og.Config(root / folder, root=root))
        for prompt in ([1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15]):
            gen = decode(model, prompt, max_length=32)
            expected = decode(reference, prompt, max_length=32).get_sequence(0)
            assert gen.get_sequence(0).tolist() == expected.tolist()
            assert gen.get_speculative_stats()["proposed"] > 0


def test_speculative_tiny_ngram_overlay(fixtures_dir: Path) -> None:
    root = fixtures_dir / "speculative-tiny"
    config = og.Config(root / "target", root=root)
    config.overlay('{"pipeline": {"strategy": {"draft": {"producer": "ngram"}}}}')
    gen = decode(og.Model(config), [1, 2, 3, 4, 5])
    assert gen.get_sequence(0).tolist() == (
        decode(plain(root / "target", root), [1, 2, 3, 4, 5]).get_sequence(0).tolist()
    )
    assert gen.get_speculative_stats()["accepted"] > 0


def test_token_tree_falls_back_to_its_best_linear_branch(fixtures_dir: Path) -> None:
    root = fixtures_dir / "speculative-tiny"
    model = og.Model(og.Config(root / "target-tree", root=root))
    lines = model.speculative.describe()
    note = next(line for line in lines if "token tree" in line)
    assert "best linear branch [0, 0] (K=2)" in note and "2D attention mask" in note
    assert model.speculative.spec.num_speculative_tokens == 2
    report = og_explain(model)
    assert "best linear branch" in report


def og_explain(model: og.Model) -> str:
    from genai_runtime.explain import explain_model, format_report

    return format_report(explain_model(model))


def test_v1_draft_and_speculative_blocks(tiny: Path, tmp_path: Path) -> None:
    """The v1 form (model.draft + speculative) maps to the same strategy as the v2 form."""
    doc = {
        "model": {
            "type": "tiny",
            "vocab_size": sm.VOCAB,
            "context_length": 48,
            "eos_token_id": sm.VOCAB - 1,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "decoder": {"filename": "../model.onnx", "num_hidden_layers": 1},
            "draft": {"filename": "../draft.onnx"},
        },
        "speculative": {"max_draft_tokens": 3, "min_adaptive_k": 0},
        "search": {"max_length": 48},
    }
    folder = tiny / "v1"
    sm.write_config(folder, doc)
    model = og.Model(og.Config(folder, root=tiny))
    assert model.speculative.spec.producer == "draft_model"
    assert model.speculative.spec.num_speculative_tokens == 3
    assert not model.speculative.spec.adaptive
    gen = decode(model, PROMPT)
    assert gen.get_sequence(0).tolist() == decode(og.Model(tiny), PROMPT).get_sequence(0).tolist()
    assert gen.get_speculative_stats()["proposed"] > 0


# --- the Generator API around rounds ---------------------------------------------------------


def test_generator_calls_between_buffered_tokens(tiny: Path) -> None:
    sm.write_config(tiny, spec_config(STRATEGIES["ngram"], SESSIONS))
    try:
        model = og.Model(tiny)
    finally:
        sm.write_config(tiny, sm.decoder_config())
    reference = decode(og.Model(tiny), PROMPT).get_sequence(0)
    gen = og.Generator(model, og.GeneratorParams(model))
    gen.append_tokens([PROMPT])
    for _ in range(6):
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == reference[: len(PROMPT) + 6].tolist()
    # get_logits mid-round: the logits plain decoding would have at this length.
    expected = sm.reference_logits(reference[: len(PROMPT) + 6], *sm.weights(0))[-1]
    np.testing.assert_allclose(gen.get_logits()[0, 0], expected, rtol=1e-5, atol=1e-5)
    gen.rewind_to(len(PROMPT) + 2)
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == reference.tolist()
    # Multi-turn: new tokens after a finished answer.
    gen.rewind_to(len(PROMPT))
    gen.append_tokens([[4, 4]])
    gen.generate_next_token()
    ref2 = reference_greedy([*PROMPT, 4, 4], *sm.weights(0), len(PROMPT) + 3)
    assert gen.get_sequence(0).tolist() == ref2


def test_adaptive_k_follows_the_acceptance_rate() -> None:
    k = AdaptiveK(8, 1)
    while k.k:  # drafts that all miss: K falls to 0
        k.update(0, k.k)
    assert [k.choose() for _ in range(4)] == [0, 0, 0, 1]  # plain steps, then a probe
    k.update(0, 1)  # the probe kept nothing: the wait doubles, then doubles again
    assert [k.choose() for _ in range(8)] == [0] * 7 + [1]
    k.update(0, 1)
    assert [k.choose() for _ in range(16)] == [0] * 15 + [1]
    k.update(1, 1)  # a probe that keeps its draft: back to waiting 4
    assert [k.choose() for _ in range(4)] == [0, 0, 0, 1]
    for _ in range(30):
        k.update(8, 8)
    assert k.choose() == 8
    fixed = AdaptiveK(5, 1, adaptive=False)
    fixed.update(0, 5)
    assert fixed.choose() == 5


def test_adaptive_k_weighs_acceptance_against_the_cost_of_a_wider_pass() -> None:
    def settled(extra_per_token: float) -> int:
        k = AdaptiveK(8, 1)
        k.timed(1, 0.010)
        for _ in range(30):
            k.timed(5, 0.010 * (1 + 4 * extra_per_token))
        for _ in range(30):
            k.update(4, 5)  # 80% of drafts accepted
        return k.choose()

    assert settled(0.1) > settled(0.3) > 1  # the cheaper a wide pass, the longer the draft
    assert settled(0.9) == 0  # each extra token costs almost a step: drafting loses


def test_adaptive_k_keeps_a_rate_per_bucket() -> None:
    k = AdaptiveK(8, 1)
    for _ in range(20):
        k.update(0, 8, bucket=1)  # one-token n-gram matches: always wrong
        k.update(8, 8, bucket=4)  # four-token matches: always right
    assert k.choose(1) == 0 and k.choose(4) == 8


def test_ngram_proposer_finds_the_latest_longest_match() -> None:
    ngram = NgramProposer(max_n=3, min_n=1)
    context = np.array([1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3], np.int32)
    assert ngram.propose(context, 4).tokens.tolist() == [4, 5, 6, 7]
    assert ngram.propose(np.array([5, 6, 8, 5], np.int32), 3).tokens.tolist() == [6, 8, 5]
    assert ngram.propose(np.array([1, 2, 3], np.int32), 3).tokens.size == 0
    chained = NgramProposer(max_n=2, min_n=1, chained=True)
    assert chained.propose(np.array([7, 8, 9, 7, 8], np.int32), 5).tokens.tolist()[:3] == [9, 7, 8]


# --- rejection sampling ---------------------------------------------------------------------


def test_accept_greedy_is_longest_match_plus_target_token() -> None:
    target = np.eye(5, dtype=np.float32)[[2, 3, 1, 4]]  # argmax 2, 3, 1, 4
    assert accept(np.array([2, 3, 0]), None, target, None) == (2, 1)
    assert accept(np.array([2, 3, 1]), None, target, None) == (3, 4)
    assert accept(np.array([0, 3, 1]), None, target, None) == (0, 2)


def test_accept_rejection_sampling_keeps_the_target_distribution() -> None:
    rng = np.random.default_rng(0)
    p = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])
    q = np.array([[0.1, 0.1, 0.1, 0.7]])
    counts = np.zeros(4)
    for x in rng.choice(4, size=20000, p=q[0]):
        n, token = accept(np.array([x]), q, p, rng)
        counts[x if n else token] += 1
    assert counts[3] == 0
    assert stats.chisquare(counts[:3], 20000 * p[0, :3]).pvalue > 1e-3


def test_rejection_sampling_first_token_follows_the_target(tiny: Path, tmp_path: Path) -> None:
    """20k first tokens drawn through a draft model + rejection sampling: chi-square vs softmax
    of the NumPy reference's logits (the target's distribution). Fixed K: adaptive K follows
    wall-clock pass costs, so its seeded stream would differ from machine to machine."""
    folder = tmp_path / "rs"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb * 0.3, head * 0.3)
    sm.context_decoder(folder / "draft.onnx", *sm.weights(3, noise=0.5))
    doc = spec_config(
        {"draft": {"producer": "draft_model", "session": "d", "adaptive": False},
         "num_speculative_tokens": 2, "acceptance": "rejection_sampling"},
        {"d": {"file": "draft.onnx"}},
    )  # fmt: skip
    model = with_config(folder, doc)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=True, top_k=sm.VOCAB, random_seed=5, max_length=20)
    gen = og.Generator(model, params)
    prompt = [1, 5, 9]
    gen.append_tokens([prompt])
    draws = 20000
    counts = np.zeros(sm.VOCAB)
    for _ in range(draws):
        gen.generate_next_token()
        counts[gen.get_next_tokens()[0]] += 1
        gen.rewind_to(len(prompt))
    logits = sm.reference_logits(np.array(prompt), emb * 0.3, head * 0.3)[-1].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    keep = p * draws >= 5  # rare tokens pooled into one bin, as chi-square needs
    observed, expected = counts[keep], p[keep] * draws
    if (~keep).any():
        observed = np.append(observed, counts[~keep].sum())
        expected = np.append(expected, p[~keep].sum() * draws)
    expected *= observed.sum() / expected.sum()
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    s = gen.get_speculative_stats()
    assert 0.0 < s["acceptance_rate"] < 1.0  # drafts were both kept and rejected


# --- controller plugins ---------------------------------------------------------------------

CONTROLLER = """
import numpy as np

def make(params):
    lookahead = params.get("lookahead", False)

    def step(ctx):
        token = int(np.argmax(ctx.logits()))
        if not lookahead or ctx.length + 2 > ctx.params["max_length"]:
            ctx.append([token])
            return
        # Two greedy tokens per call: run the first, read the logits after it.
        ran = ctx.processed
        logits = ctx.forward(list(ctx.tokens[ran:]) + [token])
        nxt = int(np.argmax(logits[-1]))
        ctx.append([token] if token in ctx.params["eos"] else [token, nxt])
        ctx.rewind_to(ran)

    return step
"""


@pytest.mark.parametrize("lookahead", [False, True])
def test_controller_plugin_reproduces_plain_greedy(tmp_path: Path, lookahead: bool) -> None:
    folder = tmp_path / "ctl"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    (folder / "controller.py").write_text(CONTROLLER)
    doc = sm.decoder_config(
        controller={"module": "controller.py", "factory": "make",
                    "params": {"lookahead": lookahead}}
    )  # fmt: skip
    sm.write_config(folder, doc)
    with pytest.raises(TrustError, match=r"controller\.py:make.*trust_remote_code=True"):
        og.Model(folder)
    model = og.Model(folder, trust_remote_code=True)
    gen = decode(model, PROMPT)
    assert gen.get_sequence(0).tolist() == reference_greedy(PROMPT, emb, head, 48)


def test_controller_module_may_not_escape_the_model_folder(tmp_path: Path) -> None:
    folder = tmp_path / "esc"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    (tmp_path / "evil.py").write_text("def make(params):\n    return None\n")
    sm.write_config(folder, sm.decoder_config(controller={"module": "../evil.py"}))
    with pytest.raises(ConfigError, match=r"pipeline\.controller\.module"):
        og.Model(folder, trust_remote_code=True)


# --- bad input ------------------------------------------------------------------------------


def test_draft_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "vocab"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    sm.context_decoder(folder / "small.onnx", emb, head[:, :16])
    doc = spec_config({"draft": {"producer": "draft_model", "session": "d"}},
                      {"d": {"file": "small.onnx"}})  # fmt: skip
    with pytest.raises(ModelError, match=r"small\.onnx has vocabulary size 16.*model\.onnx has 32"):
        with_config(folder, doc)


def test_cache_that_cannot_rewind_is_refused(tiny: Path, tmp_path: Path) -> None:
    folder = tmp_path / "window"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    doc = spec_config({"draft": {"producer": "ngram"}})
    doc["pipeline"]["state"] = {"kv_cache": {"sliding_window": {"window_size": 8}}}
    with pytest.raises(ConfigError, match=r"sliding_window.*cannot rewind"):
        with_config(folder, doc)


@pytest.mark.parametrize("k", [0, 17])
def test_num_speculative_tokens_out_of_range(tmp_path: Path, k: int) -> None:
    folder = tmp_path / f"k{k}"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    doc = spec_config({"draft": {"producer": "ngram"}, "num_speculative_tokens": k})
    with pytest.raises(ConfigError, match=r"pipeline\.strategy\.num_speculative_tokens"):
        with_config(folder, doc)


def test_other_bad_strategies(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    emb, head = sm.weights(0)
    sm.context_decoder(folder / "model.onnx", emb, head)
    sm.context_decoder(folder / "last.onnx", emb, head, logits_rank=2)
    with pytest.raises(ConfigError, match=r"draft\.ngram_sise: not a parameter"):
        with_config(folder, spec_config({"draft": {"producer": "ngram", "ngram_sise": 3}}))
    with pytest.raises(ConfigError, match=r"draft\.session"):
        with_config(folder, spec_config({"draft": {"producer": "draft_model"}}))
    with pytest.raises(ConfigError, match=r"draft\.verify_margin: expected a number >= 0"):
        with_config(folder, spec_config({"draft": {"producer": "ngram", "verify_margin": "x"}}))
    # Verification needs every position's logits.
    doc = spec_config({"draft": {"producer": "ngram"}})
    doc["pipeline"]["sessions"]["decoder"]["file"] = "last.onnx"
    with pytest.raises(ModelError, match=r"last position only"):
        with_config(folder, doc)
    model = with_config(folder, spec_config({"draft": {"producer": "ngram"},
                                             "acceptance": "greedy"}))  # fmt: skip
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=True, top_k=5)
    with pytest.raises(ConfigError, match=r"acceptance: greedy acceptance needs greedy search"):
        og.Generator(model, params)
    params = og.GeneratorParams(model)
    params.set_search_options(batch_size=2)
    with pytest.raises(og.GenaiRuntimeError, match=r"batch_size is 2"):
        og.Generator(model, params)
    sm.write_config(folder, sm.decoder_config())
    standard = og.Model(folder)
    with pytest.raises(GenerationError, match="does not decode speculatively"):
        og.Generator(standard, og.GeneratorParams(standard)).get_speculative_stats()


def test_cli_run_needs_the_trust_flag_for_a_controller(tmp_path: Path, capsys) -> None:
    from genai_runtime.cli import main

    folder = tmp_path / "cli"
    sm.context_decoder(folder / "model.onnx", *sm.weights(0))
    (folder / "controller.py").write_text(CONTROLLER)
    sm.write_config(folder, sm.decoder_config(controller={"module": "controller.py"}))
    assert main(["run", str(folder), "-p", "hi"]) == 1
    assert "--trust-remote-code" in capsys.readouterr().err


def test_concat_cache_survives_consecutive_rewinds(tiny: Path) -> None:
    """Two rewinds in a row used to leave the cache viewing freed memory (NaN logits)."""
    model = og.Model(tiny)
    expected = reference_greedy(PROMPT, *sm.weights(0), 48)
    gen = og.Generator(model, og.GeneratorParams(model))
    gen.append_tokens([PROMPT])
    for _ in range(4):
        gen.generate_next_token()
    gen.rewind_to(len(PROMPT) + 3)
    gen.generate_next_token()
    gen.rewind_to(len(PROMPT) + 3)
    gen.rewind_to(len(PROMPT) + 2)
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist() == expected
