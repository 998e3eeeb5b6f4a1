"""A stage of a plan bound to its session for one executor: its IOBinding, its feeds sorted by
source, the outputs onnxruntime allocates per run, and what it last ran."""

from __future__ import annotations

import onnxruntime as ort

from ..errors import ModelError
from ..session.bound import BoundSession
from ..session.graph_io import takes_last_position_switch
from .plan import RECURRENT_ROLES, StagePlan, role_name
from .sessions import run_options


class BoundStage:
    """A StagePlan bound to its session for one generator."""

    def __init__(self, plan: StagePlan, session: ort.InferenceSession):
        self.plan = plan
        self.step = plan.step
        # Its own RunOptions: set_runtime_option changes it, also while a run is in flight.
        options = run_options(dict(plan.session.options.run_options)) or ort.RunOptions()
        self.bound = BoundSession(plan.name, session, plan.io, options)
        self.shapes: dict[str, tuple[int, ...]] = {}  # last shape bound per output
        self.role_feeds = plan.feeds_from("role")
        # The ids dtype, read once (used per token).
        self.dtypes = {f.name: f.info.dtype for f in self.role_feeds if f.role == "input_ids"}
        self.wire_feeds = plan.feeds_from("wire")
        self.user_feeds = plan.feeds_from("user")
        self.has_kv = bool(plan.feeds_from("kv"))
        self.has_cross = bool(plan.feeds_from("cross"))
        # A graph whose [B, S, V] logits can be cut to each row's last position (graph_io).
        self.last_position_switch = takes_last_position_switch(session, plan.logits)
        # Outputs of a per_image stage: concatenated over images, read instead of the binding.
        self.joined: dict[str, ort.OrtValue] = {}
        self.recurrent = []  # (input, output feeding it next pass)
        for feed in self.role_feeds:
            if feed.role in RECURRENT_ROLES:
                out = role_name(plan.session, RECURRENT_ROLES[feed.role])
                if out not in plan.io.outputs:
                    raise ModelError(
                        f"{plan.io.file}: recurrent input {feed.name!r} needs output {out!r} "
                        f"({RECURRENT_ROLES[feed.role]}); outputs: {', '.join(plan.io.outputs)}"
                    )
                self.recurrent.append((feed.name, out))
        self.alloc_outputs = alloc_outputs(plan)

    def bind_alloc_outputs(self) -> None:
        # Rebinding drops the tensor the last run left bound, which onnxruntime would otherwise
        # take as a preallocated output of the old shape.
        for name in self.alloc_outputs:
            self.bound.bind_output_alloc(name)


def alloc_outputs(plan: StagePlan) -> list[str]:
    """Outputs neither the KV cache nor the logits buffer holds: wire sources and the rest
    (readable through get_output()), allocated by onnxruntime per run, as their shapes change
    with the number of tokens in a pass."""
    claimed = set()
    if plan.layout is not None:
        claimed.update(n for layer in plan.layout.present for n in layer)
    if plan.logits is not None:
        claimed.add(plan.logits.name)
    return [n for n in plan.io.outputs if n not in claimed]


def stage_output(stage: BoundStage, name: str) -> ort.OrtValue:
    joined = stage.joined.get(name)
    return joined if joined is not None else stage.bound.output(name)
