"""Write a complete model folder from a GGUF file or a Hugging Face folder, atomically.

Everything goes into a hidden temporary folder beside the destination, which is renamed into
place only when every file is written: an interrupted or failed import leaves nothing under the
destination name (the temporary folder is removed on failure).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import GenaiRuntimeError, ModelError, UnsupportedError
from ..folder_hashes import OLD_REPORT_FILE, REPORT_FILE, record_files
from ..generation_defaults import SAMPLING_FILE
from .checkpoint import Checkpoint, Hyper
from .destination import check_destination
from .gemma3_graph import build_gemma3_decoder, genai_config_extras
from .gguf_file import GGUFModel
from .hf_folder import HFCheckpoint
from .linear import FAST_ACCURACY
from .llama_graph import build_decoder
from .quantise import QUANTS
from .tokenizer_json import tokenizer_config, tokenizer_json

# --cache value -> whether one preallocated buffer is read and written in place.
CACHE_LAYOUTS: dict[str, bool] = {"share-buffer": True, "concat": False, "static-scatter": False}
DEFAULT_MAX_SEQ_LEN = 2048  # static-scatter: the caches are allocated whole, so not 8k+
# The fast CPU default: 4-bit weights, int8 activations in MatMulNBits (the reference builder's
# CPU default). --accuracy-level 0 keeps fp32 activations: exact weights, exact math, ~2x slower.
DEFAULT_QUANT, DEFAULT_ACCURACY = "int4", FAST_ACCURACY
ACCURACY_LEVELS = (0, FAST_ACCURACY)
# Family.block -> the graph builder for that decoder block.
DECODERS: dict[str, Callable[..., Any]] = {"llama": build_decoder, "gemma3": build_gemma3_decoder}


@dataclass(frozen=True)
class ImportResult:
    out_dir: Path
    seconds: float
    nbits: tuple[str, ...]
    dequantised: tuple[str, ...]


V2_FILE = "genai_config.v2.json"


def genai_config(
    h: Hyper,
    ids: dict[str, Any],
    cache: str,
    max_seq_len: int | None = None,
    search: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A v1 genai_config.json: onnxruntime-genai's builder format, which both runtimes load for
    the GroupQueryAttention layouts; the static-scatter layout only loads here. ``ids``: bos /
    eos / pad token ids (eos may be a list); ``search``: defaults from generation_config.json."""
    eos = ids.get("eos_token_id", 0)
    first_eos = eos[0] if isinstance(eos, list) and eos else eos
    doc = {
        "model": {
            "bos_token_id": ids.get("bos_token_id", first_eos),
            "context_length": h.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": h.head_size,
                "hidden_size": h.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": h.heads,
                "num_hidden_layers": h.layers,
                "num_key_value_heads": h.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": ids.get("pad_token_id", first_eos),
            "type": h.arch,
            "vocab_size": h.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": h.context_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": CACHE_LAYOUTS[cache],
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
            **(search or {}),
        },
    }
    if cache == "static-scatter":
        decoder = doc["model"]["decoder"]
        decoder["inputs"] = {
            "input_ids": "input_ids",
            "position_ids": "position_ids",
            "past_key_names": "key_cache.%d",
            "past_value_names": "value_cache.%d",
            "write_indices": "write_indices",
            "nonpad_kv_seqlen": "nonpad_kv_seqlen",
        }
        decoder["outputs"] = {
            "logits": "logits",
            "present_key_names": "updated_key_cache.%d",
            "present_value_names": "updated_value_cache.%d",
        }
        doc["search"]["max_length"] = max_seq_len
    return doc


def v2_config(v1: dict[str, Any]) -> dict[str, Any]:
    """The same model in the v2 pipeline form (``genai_config.v2.json``), as ``migrate``
    writes it; ``Model(folder / V2_FILE)`` loads it."""
    from ..config import to_v2

    doc = to_v2(v1, 1)
    return {"$schema": "genai_config.v2.schema.json", **{k: v for k, v in doc.items()}}


def _choice(value: str, valid: Any, what: str) -> None:
    if value not in valid:
        raise GenaiRuntimeError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def open_checkpoint(source: str | os.PathLike) -> Checkpoint:
    """A GGUF file or a Hugging Face folder (``config.json`` + ``*.safetensors``)."""
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").exists():  # one that is not a file: HFCheckpoint says
            raise ModelError(
                f"{path}: not a Hugging Face checkpoint folder (no config.json) and not a GGUF file"
            )
        return HFCheckpoint(path)
    return GGUFModel(path)


def check_settings(quant: str, accuracy_level: int, cache: str) -> None:
    _choice(quant, QUANTS, "--quant")
    _choice(cache, CACHE_LAYOUTS, "--cache")
    if accuracy_level not in ACCURACY_LEVELS:
        raise GenaiRuntimeError(
            f"unknown --accuracy-level {accuracy_level!r}; valid: "
            f"{', '.join(map(str, ACCURACY_LEVELS))}"
        )
    if quant in ("int8", "int8-wide") and accuracy_level < FAST_ACCURACY:
        raise GenaiRuntimeError(
            f"--quant {quant} needs --accuracy-level 4: onnxruntime's 8-bit MatMulNBits with fp32 "
            "activations runs ~45x slower than fp32 (for exact weights use --quant fp32)"
        )


def import_model(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    quant: str = DEFAULT_QUANT,
    accuracy_level: int = DEFAULT_ACCURACY,
    cache: str = "share-buffer",
    max_seq_len: int | None = None,
    force: bool = False,
    progress: Callable[[str, int], None] | None = None,
    extra_report: dict[str, Any] | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import a GGUF file or Hugging Face folder into the model folder ``out_dir`` (written
    atomically).

    ``max_seq_len``: the static-scatter caches' fixed length (default the smaller of
    ``DEFAULT_MAX_SEQ_LEN`` and the model's context length); other layouts ignore it.
    """
    check_settings(quant, accuracy_level, cache)
    if max_seq_len is not None and (cache != "static-scatter" or max_seq_len < 1):
        raise GenaiRuntimeError(
            f"--max-seq-len {max_seq_len}: a positive length, and only with --cache static-scatter"
        )
    out = Path(out_dir)
    check_destination(Path(source), out, force=force, reports=(REPORT_FILE, OLD_REPORT_FILE))
    start = time.perf_counter()
    model = open_checkpoint(source)
    h = model.hyper
    static = None
    if cache == "static-scatter":
        if DECODERS[model.family.block] is not build_decoder:
            raise UnsupportedError(
                f"--cache static-scatter builds llama-family graphs; {model.arch} has its own "
                "graph builder (use share-buffer or concat)"
            )
        static = max_seq_len or min(DEFAULT_MAX_SEQ_LEN, h.context_length)
        if static > h.context_length:
            raise GenaiRuntimeError(
                f"--max-seq-len {static} exceeds the model's context length {h.context_length}"
            )
    # Tokenizer documents are made before any file is written (they can fail).
    docs: dict[str, Any] = {}
    copies: dict[str, Path] = {}
    if isinstance(model, HFCheckpoint):
        copies = model.tokenizer_files()
        ids, search = model.token_ids(), model.search_defaults()
    else:
        vocab = model.vocab()
        docs["tokenizer.json"] = tokenizer_json(vocab, model.source)
        docs["tokenizer_config.json"] = tokenizer_config(vocab, h.context_length)
        ids = {
            k: v
            for k, v in (
                ("bos_token_id", vocab.bos_id),
                ("eos_token_id", vocab.eos_id),
                ("pad_token_id", vocab.pad_id),
            )
            if v is not None
        }
        search = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary folder
        share = CACHE_LAYOUTS[cache]
        layout = {"static_scatter": static} if static else {}
        report = DECODERS[model.family.block](
            model,
            tmp,
            quant=quant,
            accuracy_level=accuracy_level,
            progress=progress,
            share_buffer=share,
            **layout,
        )
        v1 = genai_config(h, ids, cache, static, search)
        extras = genai_config_extras(model, share)
        v1["model"].update(extras["model"])
        v1["model"]["decoder"].update(extras["decoder"])
        sampling = model.sampling_defaults()
        if sampling:  # what run and chat sample with when no flag says otherwise
            docs[SAMPLING_FILE] = sampling
        docs |= {
            "genai_config.json": v1,
            V2_FILE: v2_config(v1),
            REPORT_FILE: {
                "source": str(model.source),
                "format": "huggingface" if isinstance(model, HFCheckpoint) else "gguf",
                "architecture": model.arch,
                "quant": quant,
                "accuracy_level": accuracy_level,
                "cache": cache,
                **({"max_seq_len": static} if static else {}),
                "weights": dict(Counter(how for _, how in report.formats)),
                "matmul_nbits": list(report.nbits),
                "float_weights": list(report.dequantised),
                **(extra_report or {}),
            },
        }
        for name, doc in docs.items():
            (tmp / name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", "utf-8")
        for name, path in copies.items():
            shutil.copyfile(path, tmp / name)
        if on_stage is not None:
            on_stage("import: recording the files' hashes")
        record_files(tmp, REPORT_FILE)  # what `pull` and `run` check the folder against
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ImportResult(out, time.perf_counter() - start, report.nbits, report.dequantised)


# The GGUF-only name the importer started with; both sources go through one path.
import_gguf = import_model


def _replace_dir(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first, then deleted."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
