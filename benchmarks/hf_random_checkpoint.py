"""Write small random-weight Hugging Face checkpoints with transformers (offline), for
``hf_import_parity.py``. Runs in a side environment that has torch and transformers:

    SIDE/bin/python benchmarks/hf_random_checkpoint.py OUT_DIR --tokenizer TOKENIZER_DIR \
        [--archs llama mistral qwen2 qwen3 phi3 gemma3]

Each ``OUT_DIR/ARCH`` gets ``config.json``, ``model.safetensors`` (fp32), ``generation_config.json``
and the tokenizer files of ``TOKENIZER_DIR`` (a real tokenizer: its vocabulary sizes the model).
Weights are drawn by transformers' own initialisation with a fixed seed, then scaled up so the
random model's logits are not all near-ties.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

COMMON = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def configs(vocab: int, bos: int, eos: int) -> dict:
    import transformers as T

    ids = dict(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    return {
        "llama": T.LlamaConfig(**COMMON, **ids, tie_word_embeddings=False),
        # A window the parity prompts stay inside: onnxruntime-genai 0.18 fails on the builder's
        # own export once a sequence passes it (present shape 40 vs 41 with a window of 24).
        "mistral": T.MistralConfig(**COMMON, **ids, sliding_window=48),
        "qwen2": T.Qwen2Config(**COMMON, **ids, tie_word_embeddings=True, rope_theta=1e6),
        "qwen3": T.Qwen3Config(**COMMON, **ids, head_dim=96, tie_word_embeddings=True),
        "phi3": T.Phi3Config(
            **{**COMMON, "max_position_embeddings": 256},
            **ids,
            original_max_position_embeddings=64,
            partial_rotary_factor=0.5,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0 + 0.02 * i for i in range(16)],
                "long_factor": [1.5 + 0.2 * i for i in range(16)],
            },
        ),
        "gemma3": T.Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 6},
            **ids,
            head_dim=64,
            query_pre_attn_scalar=64,
            sliding_window=16,
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--archs", nargs="+", default=None)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    bos = tok.bos_token_id if tok.bos_token_id is not None else eos
    made = []
    for arch, cfg in configs(len(tok), bos, eos).items():
        if args.archs and arch not in args.archs:
            continue
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:  # wider weights than the 0.02 init: decisive logits
                    p.mul_(4.0 if "embed" not in name else 20.0)
        folder = args.out / arch
        model.save_pretrained(str(folder), safe_serialization=True)
        tok.save_pretrained(str(folder))
        for extra in ("chat_template.jinja",):
            if (args.tokenizer / extra).is_file():
                shutil.copy(args.tokenizer / extra, folder / extra)
        made.append(arch)
    print(json.dumps(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
