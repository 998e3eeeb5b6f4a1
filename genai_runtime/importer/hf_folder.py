"""A Hugging Face checkpoint folder (``config.json`` + ``*.safetensors``) as a ``Checkpoint``.

``config.json``'s ``model_type`` picks the family (``checkpoint.FAMILIES``, ``hf_types``); the
hyper-parameters come from it as transformers reads them (``rope_parameters`` or the older
``rope_theta`` / ``rope_scaling``, ``layer_types`` or the older sliding-window keys). Tensors are
renamed to the GGUF names the graph builders use (llama.cpp's naming: ``blk.N.attn_q.weight``),
and Gemma's norms get their ``+ 1`` as the GGUF stores them. Tokenizer files are copied as they
are; ``generation_config.json`` gives the search defaults.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..config.bounded import (
    CONFIG_LIMITS,
    TOKENIZER_LIMITS,
    LimitError,
    clip_text,
    load_json,
    read_bounded,
)
from ..errors import ModelError, UnsupportedError
from ..folder_paths import folder_file
from .checkpoint import (
    FAMILIES,
    Family,
    Hyper,
    Rope,
    SourceWeight,
    check_shapes,
    longrope_scale,
    rope_problem,
)
from .hf_checks import (
    check_config,
    check_factors,
    check_llama3,
    check_rope_dim,
    present,
    rope_kind,
    token_ids_problem,
    value_or,
)
from .safetensors_file import SafetensorsFile

# Hugging Face per-layer suffix -> GGUF suffix (llama.cpp's names); a family's ``hf_renames``
# come first. Phi-3's fused projections keep their fused form (``attn_qkv``, ``ffn_up``).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# Copied into the model folder as they are, when present (tokenizer.json is required).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
SEARCH_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")


def hf_architectures() -> dict[str, str]:
    """config.json ``model_type`` -> family key."""
    return {t: arch for arch, fam in FAMILIES.items() for t in fam.hf_types}


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").exists()


class HFCheckpoint:
    """A Hugging Face folder opened read-only: config, tensor index, tokenizer files."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder)
        self.source = str(self.path)
        self.config = self._json("config.json", required=True)
        model_type = self.config.get("model_type")
        arch = hf_architectures().get(str(model_type))
        if arch is None:
            found = clip_text(str(self.config.get("architectures")))
            raise UnsupportedError(
                f"{self.path / 'config.json'}: model_type {clip_text(repr(model_type))} "
                f"(architectures {found}) is not supported; supported model_type values: "
                f"{', '.join(sorted(hf_architectures()))}"
            )
        self.arch: str = arch
        self.family: Family = FAMILIES[arch]
        check_config(self.path / "config.json", self.config)  # before anything is sized from it
        self.files, self.where = self._tensor_index()
        self.generation = self._json("generation_config.json", required=False)
        self.hyper: Hyper = self._hyper()
        problem = rope_problem(self.hyper)
        if problem:
            raise ModelError(f"{self.path / 'config.json'}: rope parameters: {problem}")
        check_shapes(self, "config.json")

    # -- files -----------------------------------------------------------------------------
    def _json(self, name: str, required: bool) -> dict[str, Any]:
        path = self.path / name
        if not present(path):
            if required:
                raise ModelError(f"{self.path}: no {name}")
            return {}
        folder_file(self.path, name)  # a symlink must not read a file outside the folder
        try:
            doc = load_json(read_bounded(path, CONFIG_LIMITS.max_bytes), CONFIG_LIMITS)
        except (OSError, ValueError, LimitError) as exc:  # UnicodeDecodeError too
            raise ModelError(f"{path}: not readable JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise ModelError(f"{path}: expected a JSON object, found {type(doc).__name__}")
        return doc

    def _local_file(self, name: str, origin: str) -> Path:
        """A file named by the folder's own index: a plain name inside the folder, no escape."""
        path = self.path / name
        shown = clip_text(repr(name))
        plain = bool(name) and "\x00" not in name and Path(name).name == name
        if not plain or not path.resolve().is_relative_to(self.path.resolve()):
            raise ModelError(f"{origin}: file name {shown} is not a plain file in {self.path}")
        if not present(path):
            raise ModelError(f"{origin}: names {shown}, which is not in {self.path}")
        return path

    def _tensor_index(self) -> tuple[dict[str, SafetensorsFile], dict[str, tuple[str, str]]]:
        """(file name -> opened file, GGUF name -> (file name, HF tensor name))."""
        index = self.path / "model.safetensors.index.json"
        if present(index):
            weight_map = self._json(index.name, required=True).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelError(f"{index}: no weight_map object")
            names = sorted({str(v) for v in weight_map.values()})
        else:
            names = sorted(p.name for p in self.path.glob("*.safetensors"))
        if not names:
            raise ModelError(f"{self.path}: no *.safetensors files (a PyTorch .bin checkpoint?)")
        files = {n: SafetensorsFile(self._local_file(n, str(index))) for n in names}
        where: dict[str, tuple[str, str]] = {}
        renames = dict(self.family.hf_renames)
        for file_name, f in files.items():
            for hf_name in f.entries:
                name = gguf_name(hf_name, renames)
                if name is not None:
                    where[name] = (file_name, hf_name)
        return files, where

    def tokenizer_files(self) -> dict[str, Path]:
        """The tokenizer files to copy (name -> path); tokenizer.json must be one."""
        found = {n: folder_file(self.path, n) for n in TOKENIZER_FILES if present(self.path / n)}
        if "tokenizer.json" not in found:
            raise ModelError(
                f"{self.path}: no tokenizer.json (the fast tokenizer's file, which "
                "genai_runtime reads; save one with transformers' tokenizer.save_pretrained)"
            )
        for path in found.values():
            check_tokenizer_file(path)
        return found

    # -- hyper-parameters ------------------------------------------------------------------
    def _get(self, key: str, default: Any = ...) -> Any:
        value = self.config.get(key)
        if value is None:
            if default is ...:
                raise ModelError(f"{self.path / 'config.json'}: {key} is missing")
            return default
        return value

    def _hyper(self) -> Hyper:
        # check_config has checked each value's type and range; what is left is agreement.
        hidden = int(self._get("hidden_size"))
        heads = int(self._get("num_attention_heads"))
        head_size = int(self._get("head_dim", self._derived_head_size(hidden, heads)))
        kv_heads = int(self._get("num_key_value_heads", heads))
        if heads % kv_heads:
            raise ModelError(
                f"{self.path / 'config.json'}: num_key_value_heads: {kv_heads} does not divide "
                f"num_attention_heads {heads}"
            )
        layers = int(self._get("num_hidden_layers"))
        context = int(self._get("max_position_embeddings"))
        params = self._rope_params()
        full = value_or(params, "full_attention", params)  # Gemma 3: one set per layer type
        local = value_or(params, "sliding_attention", {})
        tied = self.config.get("tie_word_embeddings")
        if tied is None:  # not stated: the checkpoint's own tensors tell
            tied = "output.weight" not in self.where
        window, local_layers = self._sliding(layers)
        scalar = self.config.get("query_pre_attn_scalar")
        return Hyper(
            arch=self.arch,
            layers=layers,
            hidden=hidden,
            intermediate=int(self._get("intermediate_size")),
            heads=heads,
            kv_heads=kv_heads,
            head_size=head_size,
            vocab=int(self._get("vocab_size")),
            context_length=context,
            rms_eps=float(self._get("rms_norm_eps", 1e-6)),
            rope=self._rope(full, head_size, context),
            tied_embeddings=bool(tied),
            sliding_window=window,
            local_layers=local_layers,
            local_rope_base=float(
                value_or(local, "rope_theta", self._get("rope_local_base_freq", 10000.0))
            ),
            final_softcap=float(self._get("final_logit_softcapping", 0.0)),
            attn_softcap=float(self._get("attn_logit_softcapping", 0.0)),
            query_scale=float(scalar) ** -0.5 if scalar else 0.0,
        )

    def _derived_head_size(self, hidden: int, heads: int) -> int:
        """hidden_size / num_attention_heads, when config.json states no head_dim."""
        if hidden % heads:
            raise ModelError(
                f"{self.path / 'config.json'}: hidden_size: {hidden} is not a multiple of "
                f"num_attention_heads {heads} (and no head_dim is given)"
            )
        return hidden // heads

    def _rope_params(self) -> dict[str, Any]:
        """transformers 5's ``rope_parameters``, or the older ``rope_theta`` + ``rope_scaling``."""
        params = self.config.get("rope_parameters")
        if isinstance(params, dict):
            return params
        older = dict(self.config.get("rope_scaling") or {})
        older.setdefault("rope_theta", self._get("rope_theta", 10000.0))
        return older

    def _rope(self, p: dict[str, Any], head_size: int, context: int) -> Rope:
        kind = rope_kind(p)
        where = f"{self.path / 'config.json'}: rope parameters"
        partial = float(
            value_or(p, "partial_rotary_factor", self._get("partial_rotary_factor", 1.0))
        )
        dim = check_rope_dim(where, head_size, partial)
        base = float(value_or(p, "rope_theta", self._get("rope_theta", 10000.0)))
        original = int(
            p.get("original_max_position_embeddings")
            or self._get("original_max_position_embeddings", 0)
        )
        if kind == "default":
            return Rope(base, dim)
        if kind == "linear":
            return Rope(base, dim, linear=float(p["factor"]))
        if kind == "llama3":
            check_llama3(where, float(p["low_freq_factor"]), float(p["high_freq_factor"]))
            return Rope(base, dim, factors=llama3_factors(base, dim, p))
        if kind in ("longrope", "su"):
            for key in ("short_factor", "long_factor"):
                check_factors(f"{where}: {key}", p[key], dim)
            if not original:  # the length at which the long factors take over
                raise ModelError(
                    f"{self.path / 'config.json'}: original_max_position_embeddings: missing "
                    f"(rope type {kind!r} needs it)"
                )
            attn = p.get("attention_factor") or longrope_scale(context, original)
            # Rounded to fp32 as a GGUF stores them: both sources give the same tables.
            return Rope(
                base,
                dim,
                factors=tuple(np.asarray(p["short_factor"], np.float32).tolist()),
                long_factors=tuple(np.asarray(p["long_factor"], np.float32).tolist()),
                original_context=original,
                attn_factor=float(np.float32(attn)),
            )
        raise UnsupportedError(
            f"{self.path / 'config.json'}: rope type {kind!r} is not supported; supported: "
            "default, linear, llama3, longrope"
        )

    def _sliding(self, layers: int) -> tuple[int, tuple[int, ...]]:
        """(window, sliding layers): ``layer_types`` when given, else the older keys."""
        window = int(self._get("sliding_window", 0) or 0)
        types = self.config.get("layer_types")
        if isinstance(types, list) and len(types) == layers:
            local = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
            return (window, local) if window and local else (0, ())
        if not window:
            return 0, ()
        if self.family.global_every:  # Gemma 3: every Nth layer global
            every = int(
                self._get("sliding_window_pattern", self._get("_sliding_window_pattern", 0))
                or self.family.global_every
            )
            return window, tuple(i for i in range(layers) if (i + 1) % every)
        if "use_sliding_window" in self.config:  # Qwen: from max_window_layers on, if enabled
            if not self.config.get("use_sliding_window"):
                return 0, ()
            first = int(self._get("max_window_layers", 0))
            return window, tuple(range(first, layers))
        return window, tuple(range(layers))  # Mistral, Phi-3: every layer

    # -- tensors (checkpoint.Checkpoint) ---------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.where

    def describe(self, name: str) -> str:
        if name in self.where:
            file_name, hf_name = self.where[name]
            return f"{file_name}: tensor {hf_name!r}"
        return f"tensor {hf_source_name(name, self.family)!r}"

    def weight(self, name: str) -> SourceWeight:
        if name not in self.where:
            raise ModelError(f"{self.path}: {self.describe(name)} is missing")
        file_name, hf_name = self.where[name]
        f = self.files[file_name]
        entry = f.entries[hf_name]
        offset = self.family.hf_norm_offset if name.endswith("norm.weight") else 0.0

        def fp32() -> np.ndarray:
            w = f.array(hf_name)
            return w + np.float32(offset) if offset else w

        return SourceWeight(name, entry.shape, entry.dtype, fp32)

    # -- tokenizer and search defaults -----------------------------------------------------
    def token_ids(self) -> dict[str, Any]:
        """bos / eos / pad ids: generation_config.json over config.json (eos may be a list)."""
        ids = {}
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value, source = self.generation.get(key), "generation_config.json"
            if value is None:
                value, source = self.config.get(key), "config.json"
            if value is None:
                continue
            problem = token_ids_problem(value)
            if problem:
                raise ModelError(f"{self.path / source}: {key}: {problem}")
            ids[key] = value
        return ids

    def search_defaults(self) -> dict[str, Any]:
        return {k: self.generation[k] for k in SEARCH_KEYS if self.generation.get(k) is not None}

    def sampling_defaults(self) -> dict[str, Any]:
        """The makers' recommended sampling: generation_config.json's, in search-option names."""
        return self.search_defaults()


def check_tokenizer_file(path: Path) -> None:
    """A tokenizer file to copy: within the size cap (checked before reading), UTF-8, and JSON
    where its name says so (the runtime reads it the same way)."""
    try:
        text = read_bounded(path, TOKENIZER_LIMITS.max_bytes)
        if path.suffix == ".json":
            load_json(text, TOKENIZER_LIMITS)
    except (OSError, ValueError, LimitError) as exc:  # UnicodeDecodeError too
        raise ModelError(f"{path}: not a usable tokenizer file ({clip_text(str(exc))})") from exc


def gguf_name(hf_name: str, renames: dict[str, str]) -> str | None:
    """The GGUF name of a Hugging Face tensor; None for tensors the graph does not use."""
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) < 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None
    suffix = renames.get(parts[3], LAYER_NAMES.get(parts[3]))
    return f"blk.{parts[2]}.{suffix}" if suffix else None


def hf_source_name(name: str, family: Family) -> str:
    """The Hugging Face name a GGUF name comes from (for messages about missing tensors)."""
    top = {v: k for k, v in TOP_NAMES.items()}
    if name in top:
        return top[name]
    _, layer, suffix = name.split(".", 2)
    back = {v: k for k, v in LAYER_NAMES.items()}
    back |= {v: k for k, v in family.hf_renames}
    return f"model.layers.{layer}.{back.get(suffix, suffix)}"


def llama3_factors(base: float, dim: int, p: dict[str, Any]) -> tuple[float, ...]:
    """Llama 3.1's per-dimension divisors of inv_freq (long wavelengths slowed by ``factor``,
    short ones kept, a smooth blend between)."""
    factor, low, high = (
        float(p["factor"]),
        float(p["low_freq_factor"]),
        float(p["high_freq_factor"]),
    )
    old = float(p["original_max_position_embeddings"])
    out = []
    for i in range(0, dim, 2):
        freq = base ** (-i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(freq / ((1 - smooth) * freq / factor + smooth * freq))
    return tuple(out)
