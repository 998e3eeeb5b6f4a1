"""EAGLE/MTP-style proposer head, fed by a dataflow wire from the target's hidden states."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from ...errors import ConfigError, ModelError
from ...runtime.sessions import load_sessions
from ...session.graph_io import SessionIO
from .base import EMPTY, Proposal, ranked

if TYPE_CHECKING:
    from ...runtime.driver import DriverSetup
    from ...runtime.executor import Executor
    from ...runtime.pipeline import LoadedPipeline
    from ..spec import SpeculativeSpec


class HiddenStateProposer:
    """EAGLE/MTP-style head fed by a wire from the target's hidden states.

    Its graph takes the last token's id and the target's hidden state at that position (the
    wired input) and returns next-token logits, plus optionally its own hidden state of the
    same shape (``hidden_output``, or the one output shaped like the wired input) that is fed
    back to draft further. Without one it drafts a single token per round.
    """

    free = False  # a head run per drafted token

    def __init__(
        self,
        session: ort.InferenceSession,
        io: SessionIO,
        *,
        wire_input: str,
        source: tuple[str, str],
        hidden_output: str | None,
        vocab: int,
    ):
        self.session = session
        self.io = io
        self.wire_input = wire_input
        self.source = source  # (flow stage, output tensor) on the target
        ids = [n for n, info in io.inputs.items() if n != wire_input]
        if len(ids) != 1 or not np.issubdtype(io.inputs[ids[0]].dtype, np.integer):
            raise ModelError(
                f"{io.file}: a hidden-state proposer takes the wired input {wire_input!r} and one "
                f"integer token-id input; graph inputs: {', '.join(io.inputs)}"
            )
        self.ids_input = ids[0]
        self.ids_dtype = io.inputs[ids[0]].dtype
        wired = io.inputs[wire_input]
        logits = [n for n, o in io.outputs.items() if o.static_dim(o.rank - 1) == vocab]
        if hidden_output is None:
            same = [n for n, o in io.outputs.items() if o.rank == wired.rank and n not in logits]
            hidden_output = same[0] if len(same) == 1 else None
        elif hidden_output not in io.outputs:
            raise ModelError(
                f"{io.file}: no output {hidden_output!r} (draft.hidden_output); "
                f"outputs: {', '.join(io.outputs)}"
            )
        if len(logits) != 1:
            raise ModelError(
                f"{io.file}: expected one output whose last dimension is the vocabulary "
                f"({vocab}); outputs: {', '.join(str(o) for o in io.outputs.values())}"
            )
        self.logits_output = logits[0]
        self.hidden_output = hidden_output
        self.hidden: np.ndarray | None = None  # [1, 1, H] for the last token, set by the driver

    def propose(self, context: np.ndarray, k: int, widths: list[int] | None = None) -> Proposal:
        if self.hidden is None or k <= 0:
            return Proposal(EMPTY)
        if self.hidden_output is None:
            k = 1
        outputs = [self.logits_output] + ([self.hidden_output] if self.hidden_output else [])
        hidden = self.hidden
        token = int(context[-1])
        tokens = np.empty(k, np.int32)
        candidates = [] if widths is not None else None
        for i in range(k):
            feeds = {
                self.ids_input: np.array([[token]], self.ids_dtype),
                self.wire_input: hidden,
            }
            result = self.session.run(outputs, feeds)
            row = result[0].reshape(-1, result[0].shape[-1])[-1]
            token = int(np.argmax(row))
            tokens[i] = token
            if candidates is not None:
                candidates.append(ranked(row, widths[i]))
            if self.hidden_output:
                hidden = result[1][:, -1:]
        return Proposal(tokens, candidates=candidates)

    def observe(self, num_accepted: int) -> None:
        """``observe_target`` sets ``hidden`` from the target's verify pass."""

    def observe_target(self, executor: Executor, row: int) -> None:
        """The target's hidden state at the last kept position feeds the next proposal."""
        if row < 0:
            self.hidden = None
            return
        hidden = executor.output(self.source[1])
        self.hidden = np.ascontiguousarray(hidden[:, row : row + 1])

    def on_rewind(self, length: int) -> None:
        self.hidden = None  # the target's state at the new end is not known until it runs


@dataclass(frozen=True)
class HiddenStateSource:
    """The head's session, the input the wire feeds and the target output it comes from."""

    session: ort.InferenceSession
    io: SessionIO
    wire_input: str
    source: tuple[str, str]  # (flow stage, output tensor) on the target

    @classmethod
    def load(cls, target: LoadedPipeline, spec: SpeculativeSpec, trust: bool) -> HiddenStateSource:
        pspec, session = target.spec, spec.draft_session
        wires = [w for w in pspec.dataflow if w.dst == session]
        if len(wires) != 1:
            raise ConfigError.at(
                "pipeline.dataflow",
                f"the hidden_state proposer {session!r} needs exactly one wire into it from the "
                f"target's hidden states (found {len(wires)})",
            )
        wire = wires[0]
        stages = {s.name: s for s in target.plan.stages}
        src = wire.src
        if src not in stages:  # a role alias naming the same graph file as a flow stage
            model_dir = pspec.model_dir or Path(".")
            sessions = pspec.sessions
            wanted = (model_dir / sessions[src].file).resolve() if src in sessions else None
            src = next(
                (n for n, s in stages.items() if (model_dir / s.session.file).resolve() == wanted),
                None,
            )
        if src is None or wire.src_tensor not in stages[src].io.outputs:
            raise ModelError(f"{wire}: no stage of the target's flow outputs {wire.src_tensor!r}")
        sessions, ios, errors = load_sessions(
            pspec, [session], trust=trust, turns=target.takes_turns
        )
        if errors:
            raise errors[0]
        io = ios[session]
        if wire.dst_tensor not in io.inputs:
            raise ModelError(
                f"{wire}: {io.file} has no input {wire.dst_tensor!r}; inputs: "
                f"{', '.join(io.inputs)}"
            )
        return cls(sessions[session], io, wire.dst_tensor, (src, wire.src_tensor))

    def make(self, spec: SpeculativeSpec, setup: DriverSetup) -> HiddenStateProposer:
        return HiddenStateProposer(
            self.session, self.io, wire_input=self.wire_input, source=self.source,
            hidden_output=spec.params.get("hidden_output"), vocab=setup.vocab_size,
        )  # fmt: skip

    def describe(self) -> list[str]:
        src, tensor = self.source
        return [f"hidden state: {src}.{tensor} -> {self.io.file}:{self.wire_input}"]
