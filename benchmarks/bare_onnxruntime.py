"""The floor: a minimal hand-written onnxruntime greedy loop over a decoder's ``model.onnx``.

No runtime around it: one ``InferenceSession`` with default options, IOBinding, and one
``[1, kv_heads, prompt_len + N, head_size]`` float32 buffer per key/value per layer, bound once
as both ``past_key_values.{i}.*`` input and ``present.{i}.*`` output (GroupQueryAttention's
``past_present_share_buffer``). Per step only ``input_ids``, ``attention_mask`` and ``logits``
are rebound, by pointer into preallocated numpy arrays, so nothing is allocated in the loop.

It mirrors the generator protocol the benchmark times on the other sides: ``prefill`` runs the
prompt and keeps the last logits (``append_tokens``); each ``next_token`` picks the argmax and,
from the second call on, first runs the previously chosen token (``generate_next_token``).

Used by ``vs_onnxruntime_genai.py --worker bare``; runnable alone as
``python benchmarks/bare_onnxruntime.py MODEL_DIR --prompt-ids '[1, 2, 3]' --new-tokens 16``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort


class BareDecoder:
    """A session over the model folder's decoder; ``start`` prepares one generation."""

    def __init__(self, model_dir: str | Path, threads: int | None = None):
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "genai_config.json").read_text())
        decoder = config["model"]["decoder"]
        self.num_layers: int = decoder["num_hidden_layers"]
        self.kv_heads: int = decoder["num_key_value_heads"]
        self.head_size: int = decoder["head_size"]
        self.vocab_size: int = config["model"]["vocab_size"]
        inputs, outputs = decoder["inputs"], decoder["outputs"]
        self.input_ids_name: str = inputs["input_ids"]
        self.mask_name: str = inputs["attention_mask"]
        self.logits_name: str = outputs["logits"]
        self.kv_names: list[tuple[str, str]] = []  # (past input, present output)
        for i in range(self.num_layers):
            for kind in ("key", "value"):
                self.kv_names.append(
                    (inputs[f"past_{kind}_names"] % i, outputs[f"present_{kind}_names"] % i)
                )
        # Default session options unless threads are given: the floor for the same settings.
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(model_dir / decoder["filename"]), options, providers=["CPUExecutionProvider"]
        )

    def start(self, prompt_ids: list[int], max_length: int) -> BareGeneration:
        return BareGeneration(self, prompt_ids, max_length)


class BareGeneration:
    """One greedy generation with all buffers allocated up front and the KV cache bound once."""

    def __init__(self, decoder: BareDecoder, prompt_ids: list[int], max_length: int):
        self.d = decoder
        self.max_length = max_length
        self.prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(1, -1)
        self.length = 0  # tokens already run through the model
        self.sequence: list[int] = list(prompt_ids)
        self.mask = np.ones((1, max_length), dtype=np.int64)
        self.step_ids = np.zeros((1, 1), dtype=np.int64)
        self.step_logits = np.empty((1, 1, decoder.vocab_size), dtype=np.float32)
        self.logits: np.ndarray | None = None  # [V] awaiting a token choice
        self.io = decoder.session.io_binding()
        # The buffers must outlive the binding: ORT only holds their pointers.
        shape = (1, decoder.kv_heads, max_length, decoder.head_size)
        self.kv = [np.zeros(shape, dtype=np.float32) for _ in decoder.kv_names]
        for (past, present), buf in zip(decoder.kv_names, self.kv):
            self._bind_input(past, buf, shape)
            self._bind_output(present, buf, shape)

    def _bind_input(self, name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
        self.io.bind_input(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)

    def _bind_output(self, name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
        self.io.bind_output(name, "cpu", 0, array.dtype, list(shape), array.ctypes.data)

    def _run(self, ids: np.ndarray, logits: np.ndarray) -> None:
        n = ids.shape[1]
        total = self.length + n
        self._bind_input(self.d.input_ids_name, ids, ids.shape)
        # GQA reads past length from the mask's sum and total length from its width.
        self._bind_input(self.d.mask_name, self.mask, (1, total))
        self._bind_output(self.d.logits_name, logits, logits.shape)
        self.d.session.run_with_iobinding(self.io)
        self.length = total
        self.logits = logits[0, -1]

    def prefill(self) -> None:
        """Run the prompt; its last logits choose the first token (like ``append_tokens``)."""
        prompt_logits = np.empty((1, self.prompt.shape[1], self.d.vocab_size), np.float32)
        self._run(self.prompt, prompt_logits)

    def next_token(self) -> int:
        """Run the pending token if any, then pick the argmax (like ``generate_next_token``)."""
        if self.logits is None:
            self._run(self.step_ids, self.step_logits)
        assert self.logits is not None
        token = int(np.argmax(self.logits))
        self.sequence.append(token)
        self.step_ids[0, 0] = token
        self.logits = None
        return token

    def is_done(self) -> bool:
        return len(self.sequence) >= self.max_length


def generate(decoder: BareDecoder, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy-generate exactly ``new_tokens`` ids after the prompt."""
    gen = decoder.start(prompt_ids, len(prompt_ids) + new_tokens)
    gen.prefill()
    return [gen.next_token() for _ in range(new_tokens)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--prompt-ids", required=True, help="JSON list of token ids")
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    ids: Any = json.loads(args.prompt_ids)
    print(json.dumps(generate(BareDecoder(args.model_dir), ids, args.new_tokens)))


if __name__ == "__main__":
    main()
