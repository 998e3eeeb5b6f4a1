"""The cross-attention cache: keys/values an init stage (the encoder) writes once per input and
a step stage (the decoder) reads on every pass.

The encoder's output OrtValues are bound as the decoder's inputs by reference, once per encoder
run: no copy per step, and rewinding the decoder leaves them alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GenerationError, ModelError
from ..session.bound import BoundSession
from ..session.graph_io import SessionIO
from ..spec import SessionSpec

# (decoder input role, its default pattern, encoder output role, its default pattern)
_ROLES = (
    ("cross_past_key_names", "past_key_cross_%d", "cross_present_key_names",
     "present_key_cross_%d"),
    ("cross_past_value_names", "past_value_cross_%d", "cross_present_value_names",
     "present_value_cross_%d"),
)  # fmt: skip


@dataclass(frozen=True)
class CrossLayout:
    source: str  # the session that writes the cache (runs in phase init)
    pairs: tuple[tuple[str, str], ...]  # (source output, reader input), per layer, keys first

    @property
    def inputs(self) -> frozenset[str]:
        return frozenset(dst for _, dst in self.pairs)


def detect_cross(
    source: str, src_io: SessionIO, src: SessionSpec, dst_io: SessionIO, dst: SessionSpec
) -> CrossLayout | None:
    """The cross cache between two sessions, from the role patterns (or the reference's names);
    None when the reader declares no cross inputs (e.g. it takes ``encoder_hidden_states``)."""
    pairs = []
    for in_role, in_default, out_role, out_default in _ROLES:
        read = dst.inputs.get(in_role, in_default)
        write = src.outputs.get(out_role, out_default)
        if "%d" not in read or "%d" not in write:
            raise ModelError(f"{dst_io.file}: cross cache pattern {read!r} / {write!r} has no %d")
        layer = 0
        while read % layer in dst_io.inputs:
            if write % layer not in src_io.outputs:
                raise ModelError(
                    f"{dst_io.file} reads cross-attention input {read % layer!r} but "
                    f"{src_io.file} has no output {write % layer!r} (pattern {write!r}); "
                    f"outputs: {', '.join(src_io.outputs)}"
                )
            pairs.append((write % layer, read % layer))
            layer += 1
    return CrossLayout(source, tuple(pairs)) if pairs else None


class CrossCache:
    """Holds the source stage's outputs of its last run and binds them into readers."""

    kind = "cross"

    def __init__(self, layout: CrossLayout):
        self.layout = layout
        self.epoch = 0  # bumped per capture; a reader rebinds only when it changes
        self._values: dict[str, object] = {}
        self._bound: dict[int, int] = {}

    def capture(self, source: BoundSession) -> None:
        self._values = {dst: source.output(src) for src, dst in self.layout.pairs}
        self.epoch += 1

    def bind(self, reader: BoundSession) -> None:
        if self._bound.get(id(reader)) == self.epoch:
            return  # still bound from the last pass
        if not self._values:
            raise GenerationError(
                f"the cross-attention cache is empty: {self.layout.source!r} has not run "
                "(give it its inputs with set_inputs / set_model_input first)"
            )
        for name, value in self._values.items():
            reader.bind_value(name, value)
        self._bound[id(reader)] = self.epoch

    @property
    def nbytes(self) -> int:
        return sum(value.tensor_size_in_bytes() for value in self._values.values())

    def rewind_to(self, length: int) -> None:
        """The cross cache depends on the input, not the decoded length: nothing to forget."""
