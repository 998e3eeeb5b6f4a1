"""Token-tree verification: every node of a Medusa-style tree goes through the target in one
pass with a 4D attention mask, and the kept path matches plain greedy decoding.

Fixture: ``speculative_models.tree_decoder`` (each new token sums the cached rows its 4D mask
selects, plus a position embedding) next to a NumPy reference of the same math, so a wrong
mask, a wrong node position or a wrongly compacted cache changes the tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import speculative_models as sm
from scipy import stats

import genai_runtime as og
from genai_runtime.decoding.token_tree import parse_tree, walk_tree
from genai_runtime.errors import ConfigError
from genai_runtime.explain import explain_model, format_report

PROMPT = [1, 5, 9, 2, 7, 5, 9]
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0, 0]]  # fmt: skip


def greedy_reference(prompt: list[int], max_length: int) -> list[int]:
    emb, head = sm.weights(0)
    pos = sm.positions_table()
    tokens = list(prompt)
    while len(tokens) < max_length:
        nxt = int(np.argmax(sm.tree_reference_logits(np.array(tokens), emb, head, pos)[-1]))
        if nxt == sm.VOCAB - 1:  # EOS ends the answer and is not part of the sequence
            break
        tokens.append(nxt)
    return tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Target model.onnx, a noisy draft (also 4D-masked) and an MTP head, all tree-capable."""
    root = tmp_path_factory.mktemp("tree")
    pos = sm.positions_table()
    sm.tree_decoder(root / "model.onnx", *sm.weights(0), pos)
    sm.tree_decoder(root / "draft.onnx", *sm.weights(7, noise=0.35), pos)
    sm.mtp_head(root / "mtp.onnx", *sm.weights(0))
    return root


def model_with(root: Path, name: str, strategy: dict | None, **extra) -> og.Model:
    doc = sm.decoder_config(**extra)
    doc["pipeline"]["sessions"].update(
        {"draft": {"file": "../draft.onnx"}, "mtp": {"file": "../mtp.onnx"}}
    )
    doc["pipeline"]["sessions"]["decoder"]["file"] = "../model.onnx"
    if strategy is not None:
        doc["pipeline"]["strategy"] = {"kind": "speculative", **strategy}
    folder = root / name
    sm.write_config(folder, doc)
    return og.Model(og.Config(folder, root=root))


def run(model: og.Model, prompt: list[int], **search) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(**{"max_length": 48, **search})
    gen = og.Generator(model, params)
    gen.append_tokens([prompt])
    while not gen.is_done():
        gen.generate_next_token()
    return gen


def test_4d_mask_decoder_matches_numpy_reference(folder: Path) -> None:
    model = model_with(folder, "plain", None)
    assert run(model, PROMPT).get_sequence(0).tolist() == greedy_reference(PROMPT, 48)
    # A right-padded batch: the pad column stays masked for every later token.
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=20, batch_size=2)
    gen = og.Generator(model, params)
    gen.append_tokens([[3, 1, 4, 1], [5, 9, 0, 0]])
    while not gen.is_done():
        gen.generate_next_token()
    assert gen.get_sequence(0).tolist()[:20] == greedy_reference([3, 1, 4, 1], 20)
    row = gen.get_sequence(1).tolist()
    assert row[:2] + row[4:] == greedy_reference([5, 9], 18)


STRATEGIES = {
    "draft-model": {"draft": {"producer": "draft_model", "session": "draft"}},
    "hidden-state": {"draft": {"producer": "hidden_state", "session": "mtp"}},
    "ngram": {"draft": {"producer": "ngram", "ngram_size": 2}},
}


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("prompt", [PROMPT, [3, 3, 3, 3], [4, 8, 15, 16, 23, 4, 8]])
def test_tree_verification_is_plain_greedy(folder: Path, name: str, prompt: list[int]) -> None:
    strategy = {**STRATEGIES[name], "num_speculative_tokens": 5, "tree": {"medusa_choices": TREE}}
    extra = {}
    if name == "hidden-state":
        extra["dataflow"] = [{"from": "decoder.hidden_states", "to": "mtp.prev_hidden"}]
    model = model_with(folder, f"tree-{name}", strategy, **extra)
    note = model.speculative.spec.tree_note
    assert "verified in one pass with a tree attention mask" in note, note
    gen = run(model, prompt)
    expected = greedy_reference(prompt, 48)
    assert gen.get_sequence(0).tolist() == expected
    s = gen.get_speculative_stats()
    assert s["tokens"] == len(expected) - len(prompt) + (len(expected) < 48)  # + the EOS
    assert s["proposed"] > 0
    if name == "draft-model":  # the MTP head ignores positions; n-gram needs repeats
        assert s["accepted"] > 0 and s["rounds"] < s["tokens"]


def test_the_tree_keeps_tokens_off_its_best_branch(folder: Path) -> None:
    """The noisy draft's second and third choices are sometimes the target's: a tree keeps
    them, its best linear branch alone cannot, so the tree needs fewer target passes."""
    tree = {**STRATEGIES["draft-model"], "num_speculative_tokens": 5,
            "tree": {"medusa_choices": TREE}}  # fmt: skip
    linear = {"draft": {"producer": "draft_model", "session": "draft", "adaptive": False},
              "num_speculative_tokens": 5}  # fmt: skip
    prompts = [PROMPT, [3, 3, 3, 3], [4, 8, 15, 16, 23, 4, 8], [2, 7, 1, 8, 2, 8]]
    with_tree = model_with(folder, "side-tree", tree)
    without = model_with(folder, "side-linear", linear)
    side = passes_tree = passes_linear = 0
    for prompt in prompts:
        a, b = run(with_tree, prompt), run(without, prompt)
        assert a.get_sequence(0).tolist() == b.get_sequence(0).tolist()
        side += a.get_speculative_stats()["tree_side_accepts"]
        passes_tree += a.get_speculative_stats()["rounds"]
        passes_linear += b.get_speculative_stats()["rounds"]
    assert side > 0
    assert passes_tree < passes_linear


def test_explain_says_how_the_tree_is_verified(folder: Path) -> None:
    strategy = {**STRATEGIES["ngram"], "tree": {"medusa_choices": [[0], [0, 0], [1]]}}
    model = model_with(folder, "explain", strategy)
    assert "tree attention mask" in format_report(explain_model(model))


def test_tree_with_rejection_sampling_runs_and_keeps_drafts(folder: Path) -> None:
    strategy = {**STRATEGIES["draft-model"], "num_speculative_tokens": 4,
                "acceptance": "rejection_sampling", "tree": {"medusa_choices": TREE}}  # fmt: skip
    model = model_with(folder, "sampled", strategy)
    gen = run(model, PROMPT, do_sample=True, top_k=sm.VOCAB, random_seed=3, max_length=40)
    tokens = gen.get_sequence(0).tolist()
    assert tokens[: len(PROMPT)] == PROMPT and all(0 <= t < sm.VOCAB for t in tokens)
    assert gen.get_speculative_stats()["accepted"] > 0


def test_walk_tree_sampling_keeps_the_target_distribution() -> None:
    """20k walks over a root with three point-mass children (and one grandchild): the first
    token is distributed as the target's p (chi-square)."""
    rng = np.random.default_rng(0)
    p = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    parents = np.array([-1, -1, -1, 0])
    tokens = np.array([1, 3, 4, 2])
    second = np.array([0.3, 0.3, 0.2, 0.1, 0.1])
    counts = np.zeros(5)
    draws = 20000
    for _ in range(draws):
        path, token = walk_tree(parents, tokens, lambda r: p if r < 0 else second, rng)
        counts[tokens[path[0]] if path else token] += 1
    assert stats.chisquare(counts, draws * p).pvalue > 1e-3


def test_walk_tree_greedy_follows_the_argmax() -> None:
    parents = np.array([-1, -1, 0, 1])
    tokens = np.array([4, 2, 3, 1])
    rows = {-1: np.eye(5)[2], 0: np.eye(5)[3], 1: np.eye(5)[1], 2: np.eye(5)[0], 3: np.eye(5)[4]}
    path, token = walk_tree(parents, tokens, rows.__getitem__, None)
    assert (path, token) == ([1, 3], 4)  # 2 (node 1), then 1 (node 3), then the target's 4


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ([[0], [1, 0]], "has no parent [1]"),
        ([[0], [0, "a"]], "expected a non-empty list of ranks"),
        ([[i] for i in range(64)] + [[0, 0]], "at most 64"),
        ([], "non-empty list of paths"),
    ],
)
def test_bad_trees_are_config_errors(choices: list, message: str) -> None:
    with pytest.raises(ConfigError, match=r"tree\.medusa_choices") as info:
        parse_tree(choices, "pipeline.strategy.tree.medusa_choices", 5)
    assert message in str(info.value)


def test_bad_tree_in_a_config_fails_at_load(folder: Path) -> None:
    strategy = {**STRATEGIES["ngram"], "tree": {"medusa_choices": [[0], [2, 0]]}}
    with pytest.raises(ConfigError, match=r"tree\.medusa_choices"):
        model_with(folder, "bad", strategy)
