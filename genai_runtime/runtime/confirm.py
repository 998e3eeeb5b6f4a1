"""What the loaded graphs (and a one-token test run) confirm about a config.

``config_problems`` is cheap (graph declarations only) and runs at every ``Model(...)``: token
ids outside the logits' vocabulary and a ``vocab_size`` that disagrees with the graph are
``ConfigError``s at their JSON path. A probe that runs the model once on two tokens, for
``validate``: it is the only way to confirm dimensions a graph leaves symbolic (``head_size``);
it lives in ``graph_check`` with the rest of what ``validate`` runs.
"""

from __future__ import annotations

from ..errors import ConfigProblem
from ..spec import PipelineSpec
from .plan import Plan

# Where each fact sits in the source document, by config version.
_PATHS = {
    1: {
        "vocab_size": "model.vocab_size",
        "eos": "model.eos_token_id",
        "bos": "model.bos_token_id",
        "pad": "model.pad_token_id",
        "head_size": "model.decoder.head_size",
        "num_kv_heads": "model.decoder.num_key_value_heads",
    },
    2: {
        "vocab_size": "metadata.vocab_size",
        "eos": "tokens.eos",
        "bos": "tokens.bos",
        "pad": "tokens.pad",
        "head_size": "pipeline.state.kv_cache.head_size",
        "num_kv_heads": "pipeline.state.kv_cache.num_kv_heads",
    },
}


def json_path_of(spec: PipelineSpec, fact: str) -> str:
    return _PATHS.get(spec.source_version, _PATHS[2])[fact]


def graph_vocab(plan: Plan) -> tuple[int | None, str | None]:
    """The vocabulary size the logits output declares (None when symbolic), and its file."""
    for stage in plan.stages:
        if stage.logits is not None:
            return stage.logits.static_dim(stage.logits.rank - 1), stage.io.file
    return None, None


def config_problems(spec: PipelineSpec, plan: Plan) -> list[ConfigProblem]:
    """Config facts the graphs contradict: vocab_size, and eos/bos/pad ids past the vocabulary."""
    problems = []
    vocab, file = graph_vocab(plan)
    declared = spec.model.vocab_size
    if vocab is not None and declared is not None and declared != vocab:
        problems.append(
            ConfigProblem(
                json_path_of(spec, "vocab_size"),
                f"{declared} disagrees with the graph: {file} declares logits over {vocab} tokens",
            )
        )
    if vocab is None:
        return problems
    tokens = spec.tokens
    eos_path = json_path_of(spec, "eos")
    ids = [(eos_path if len(tokens.eos) == 1 else f"{eos_path}[{i}]", t)
           for i, t in enumerate(tokens.eos)]  # fmt: skip
    ids += [(json_path_of(spec, "bos"), tokens.bos), (json_path_of(spec, "pad"), tokens.pad)]
    for path, token in ids:
        if token is not None and token >= vocab:
            problems.append(
                ConfigProblem(
                    path,
                    f"token id {token} is outside the vocabulary: {file} declares logits over "
                    f"{vocab} tokens (ids 0..{vocab - 1})",
                )
            )
    return problems
