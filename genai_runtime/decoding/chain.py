"""The decoding chain: logits ops run in order, then one terminal picks each row's token.

Two ways to get one (``make_picker``):

* v2 ``generation.logits: [{op, ...}]`` given: that list is the whole chain, built once from
  ``OPS`` and run as a plain loop. Without a terminal, ``sample`` (``do_sample``) or ``argmax``
  is appended. Before ``argmax`` a trailing run of ops that keep the argmax (temperature, top_k,
  top_p, min_p) is skipped.
* otherwise (v1 ``search`` keys, or v2 without ``logits``): onnxruntime-genai's fixed order,
  exactly: guidance, min_length, repetition_penalty, no_repeat_ngram, then greedy or its fused
  top-k/top-p/temperature sampler (``decoding.sampling``).

A grammar (``GeneratorParams.set_guidance`` or an inline ``grammar`` op) is the ``grammar`` op:
first in the reference order, where it is written in a v2 chain (first if the chain has none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ConfigProblem, GenerationError
from ..spec import SEARCH_OPTIONS, GenerationSpec, ProcessorSpec
from .guidance import GUIDANCE_KINDS, Grammar
from .picker import ReferenceGreedy, ReferenceSample, TokenPicker
from .processors import PROCESSORS, Processor, build_processor, make_chain
from .warpers import Argmax, MinP, Sample, Temperature, TopK, TopP, TypicalP

# op -> factory, for every op that maps logits to logits except ``grammar`` (it needs the
# tokenizer and the batch, so ``make_picker`` builds it).
OPS: dict[str, Callable[..., Processor]] = {
    **PROCESSORS,
    "temperature": Temperature,
    "top_k": TopK,
    "top_p": TopP,
    "min_p": MinP,
    "typical_p": TypicalP,
}
TERMINALS: dict[str, Callable[[], Any]] = {"sample": Sample, "argmax": Argmax}
VALID_OPS: tuple[str, ...] = (*OPS, "grammar", *TERMINALS)

# Generation-level keys that the reference order turns into chain links; a v2 chain replaces
# them, so setting one beside ``logits`` is a contradiction.
_CHAIN_FIELDS = tuple(name for name, option in SEARCH_OPTIONS.items() if option.chain)


class _GrammarSlot:
    """Where a grammar goes when the chain is only described (no tokenizer, no batch)."""

    keeps_argmax = False
    active = True

    def __init__(self, kind: str | None):
        self.kind = kind

    def __call__(self, tokens: np.ndarray, logits: np.ndarray) -> np.ndarray:
        raise GenerationError("this chain was built to be described, not run")

    def __repr__(self) -> str:
        return f"grammar({self.kind or 'set_guidance'})"


def _problems(error: ConfigError, prefix: str) -> list[ConfigProblem]:
    return [ConfigProblem(p.path if p.path else prefix, p.message) for p in error.problems]


def make_picker(
    generation: GenerationSpec,
    *,
    eos_token_ids: Sequence[int],
    vocab_size: int,
    batch_size: int = 1,
    guidance: tuple[str, Any] | None = None,
    tokenizer_json: Path | None = None,
    grammar_op: Processor | None = None,
    guidance_source: str = "set_guidance",
    request_ops: Sequence[Processor] = (),
) -> TokenPicker:
    """The token picker a generation runs, validated in full before any token is generated.

    ``guidance`` is ``(type, data)`` from ``GeneratorParams.set_guidance``, whose errors name
    ``guidance_source`` (the command line names its flag); ``request_ops`` run first (a server
    request's logit bias and penalties, before the config's ops, as OpenAI applies them before
    temperature and top-p); ``grammar_op`` a
    grammar already built (the server builds one per request to answer a bad schema with a
    400 before queueing), placed as guidance is. Without
    ``tokenizer_json`` the grammar is only a placeholder (for ``explain`` / ``validate``).
    Config mistakes raise one ``ConfigError`` listing every problem at its JSON path; a grammar
    llguidance rejects raises ``GenerationError`` (or ``ConfigError`` when written inline).
    """
    if guidance is not None and guidance[0] not in GUIDANCE_KINDS:
        raise GenerationError(
            f"{guidance_source}: unknown type {guidance[0]!r} "
            f"(expected one of: {', '.join(GUIDANCE_KINDS)})"
        )

    def grammar(kind: str | None, data: Any, where: str) -> Processor:
        if tokenizer_json is None:
            return _GrammarSlot(kind)
        return Grammar(
            kind, data, tokenizer_json=tokenizer_json, vocab_size=vocab_size,
            eos_token_ids=eos_token_ids, batch_size=batch_size, where=where,
        )  # fmt: skip

    if not generation.logits:
        builtins = make_chain(generation, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
        ops: list[Processor] = [*request_ops, *([] if builtins is None else builtins.processors)]
        terminal = ReferenceGreedy() if generation.is_greedy else ReferenceSample(generation)
        if guidance is not None:
            grammar_op = grammar(guidance[0], guidance[1], guidance_source)
        if grammar_op is not None:
            # The reference masks first. Its processors only mask or rescale, so a masked token
            # stays below every allowed one: for greedy, masking last picks the same token.
            ops.insert(len(ops) if generation.is_greedy else 0, grammar_op)
        return TokenPicker(ops, terminal, reference_order=True)

    plan = check_chain(generation, eos_token_ids=eos_token_ids, vocab_size=vocab_size)
    ops = list(request_ops)
    grammar_at: str | None = None
    for path, spec, op in plan.links:
        if spec.kind != "grammar":
            ops.append(op)
            continue
        grammar_at = path
        if guidance is not None:
            ops.append(grammar(guidance[0], guidance[1], guidance_source))
            continue
        if not spec.params:
            raise ConfigError(
                [
                    ConfigProblem(
                        path,
                        "grammar op without a grammar: give one of "
                        f"{', '.join(GUIDANCE_KINDS)}, or call GeneratorParams.set_guidance",
                    )
                ]
            )
        ((kind, data),) = spec.params.items()
        try:
            ops.append(grammar(kind, data, f"{path}.{kind}"))
        except GenerationError as error:
            raise ConfigError.at(f"{path}.{kind}", str(error)) from None
    if guidance is not None and grammar_at is None:
        ops.insert(0, grammar(guidance[0], guidance[1], guidance_source))

    terminal = plan.terminal
    skipped: list[Processor] = []
    if isinstance(terminal, Argmax):
        while ops and getattr(ops[-1], "keeps_argmax", False):
            skipped.insert(0, ops.pop())
    return TokenPicker(ops, terminal, skipped=skipped, implicit_terminal=plan.implicit)


@dataclasses.dataclass(frozen=True)
class ChainPlan:
    links: tuple[tuple[str, ProcessorSpec, Processor | None], ...]  # (path, entry, active op)
    terminal: Any
    implicit: bool


def check_chain(
    generation: GenerationSpec, *, eos_token_ids: Sequence[int] = (), vocab_size: int | None = None
) -> ChainPlan:
    """Validate a v2 ``generation.logits`` chain without a model; every problem at its path.

    Checks: unknown ops (listing the valid ones), parameters, ops after the terminal, a second
    grammar, grammar parameters, and generation-level keys that contradict the chain.
    """
    problems: list[ConfigProblem] = []
    default = GenerationSpec()
    for name in _CHAIN_FIELDS:
        if getattr(generation, name) != getattr(default, name):
            problems.append(
                ConfigProblem(
                    f"generation.{name}",
                    f"set to {getattr(generation, name)!r} beside generation.logits, which is "
                    "the whole chain: write it as an op there",
                )
            )
    links: list[tuple[str, ProcessorSpec, Processor | None]] = []
    terminal: Any = None
    terminal_at = ""
    grammar_at = ""
    for i, spec in enumerate(generation.logits):
        path = f"generation.logits[{i}]"
        if terminal is not None:
            problems.append(
                ConfigProblem(
                    path,
                    f"op {spec.kind!r} after the terminal {repr(terminal)!r} at {terminal_at}",
                )
            )
            continue
        if spec.kind in TERMINALS:
            if spec.params:
                problems += [
                    ConfigProblem(f"{path}.{n}", f"{spec.kind!r} takes no parameters")
                    for n in spec.params
                ]
            terminal, terminal_at = TERMINALS[spec.kind](), path
            continue
        if spec.kind == "grammar":
            if grammar_at:
                problems.append(ConfigProblem(path, f"a second grammar op (first at {grammar_at})"))
            grammar_at = path
            extra = [n for n in spec.params if n not in GUIDANCE_KINDS]
            problems += [
                ConfigProblem(
                    f"{path}.{n}",
                    f"unexpected parameter for 'grammar' (expected one of: "
                    f"{', '.join(GUIDANCE_KINDS)})",
                )
                for n in extra
            ]
            if len(spec.params) > 1 and not extra:
                problems.append(
                    ConfigProblem(path, f"give one grammar, got {', '.join(spec.params)}")
                )
            links.append((path, spec, None))
            continue
        try:
            op = build_processor(
                spec, path=path, eos_token_ids=eos_token_ids, vocab_size=vocab_size,
                registry=OPS, valid=VALID_OPS,
            )  # fmt: skip
        except ConfigError as error:
            problems += _problems(error, path)
            continue
        if getattr(op, "active", True):
            links.append((path, spec, op))
    implicit = terminal is None
    if implicit:
        terminal = Sample() if generation.do_sample else Argmax()
    elif generation.do_sample and isinstance(terminal, Argmax):
        problems.append(
            ConfigProblem(
                "generation.do_sample",
                f"do_sample is true but the chain ends in argmax at {terminal_at}",
            )
        )
    if problems:
        raise ConfigError(problems)
    return ChainPlan(tuple(links), terminal, implicit)
