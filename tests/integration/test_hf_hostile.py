"""Hostile Hugging Face checkpoint folders: every value config.json states is checked against the
bounds the GGUF import uses (one table, ``importer.bounds.SHAPES``) before anything is sized
from it; bad folders are an ``error:`` line naming the file and the key, never a traceback; a
FIFO is refused instead of read; and a bounded hypothesis fuzz target over config.json values
and the safetensors header (every outcome a GenaiRuntimeError or a good import).

``HF_FUZZ_EXAMPLES=N`` runs the fuzz target longer, with fresh random examples."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from genai_runtime.cli import main
from genai_runtime.errors import GenaiRuntimeError, ModelError
from genai_runtime.importer import import_model

H = pytest.importorskip("hf_models", reason="needs the gguf extra (gguf, safetensors)")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LIMIT = 4 << 30  # the address space the import runs in (the issue's limit)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny llama checkpoint folder, written once (the tokenizer is trained here)."""
    return H.write_hf(tmp_path_factory.mktemp("hf") / "llama", "llama")


@pytest.fixture
def folder(tiny, tmp_path) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / "hf"))


def _edit_config(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


def _cli_import(folder: Path, out: Path, capsys) -> str:
    """``genai-runtime import`` in this process: exit status 1 and one ``error:`` line (an
    exception that is not a GenaiRuntimeError would escape ``main`` and fail the test)."""
    assert main(["import", str(folder), str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert not out.exists()
    return err


# -- the memory bomb, in a 4 GiB address space ------------------------------------------------


# Runs argv[3:] under RLIMIT_AS argv[1] for at most argv[2] seconds; prints its exit status and
# its peak RSS (ru_maxrss of children). A fork copies the parent's resident set into the child's
# peak, so the command is forked from this small process, not from the test's large one.
MEASURE = """
import resource, subprocess, sys
limit, timeout, args = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
def lower():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, preexec_fn=lower)
try:
    code = proc.wait(timeout)
except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_limited(args: list[str], timeout: float) -> tuple[int, str, float, int]:
    """(exit status, stderr, seconds, peak RSS in KiB) of ``args`` run in a 4 GiB address
    space (``RLIMIT_AS`` set in ``preexec_fn``), stopped after ``timeout`` seconds."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(LIMIT), str(timeout), *args],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    code, peak_kib = (int(v) for v in done.stdout.split())
    return code, done.stderr, time.monotonic() - start, peak_kib


@pytest.mark.parametrize("layers", [2**31, 10**7], ids=["2^31", "10^7"])
def test_a_layer_count_bomb_is_refused_quickly_in_bounded_memory(folder, tmp_path, layers):
    """Before: a MemoryError traceback after growing to the limit (a tuple of 2^31 layer
    indices; ten million layers' expected tensor names)."""
    _edit_config(folder, num_hidden_layers=layers)
    cmd = [sys.executable, "-m", "genai_runtime", "import", str(folder), str(tmp_path / "out")]
    code, err, seconds, peak_kib = run_limited(cmd, timeout=60)
    print(f"num_hidden_layers {layers}: peak RSS {peak_kib / 1024:.0f} MiB in a 4 GiB limit")
    assert code == 1 and "Traceback" not in err, err[-2000:]
    assert (
        f"config.json: num_hidden_layers: expected an integer between 1 and 4096, got {layers}"
    ) in err
    assert seconds < 20 and peak_kib < 512 << 10, (seconds, peak_kib)
    assert not (tmp_path / "out").exists()


# -- bad folders: an error line naming the key ------------------------------------------------

BAD_CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("layers-0", {"num_hidden_layers": 0}, r"num_hidden_layers: expected an integer between 1"),
    ("heads-0", {"num_attention_heads": 0}, "num_attention_heads: expected an integer between 1"),
    ("heads-text", {"num_attention_heads": "4"}, "num_attention_heads: expected an integer, got"),
    ("hidden-float", {"hidden_size": 64.5}, "hidden_size: expected an integer, got float 64.5"),
    ("hidden-list", {"hidden_size": [64]}, "hidden_size: expected an integer, got list [64]"),
    (
        "layers-bool",
        {"num_hidden_layers": True},
        "num_hidden_layers: expected an integer, got bool",
    ),
    ("ffn-2^40", {"intermediate_size": 2**40}, "intermediate_size: expected an integer between"),
    ("kv-heads-3-of-4", {"num_key_value_heads": 3}, "num_key_value_heads: 3 does not divide"),
    ("head-dim-0", {"head_dim": 0}, "head_dim: expected an integer between 1"),
    ("context-2^40", {"max_position_embeddings": 2**40}, "max_position_embeddings: expected"),
    ("eps-negative", {"rms_norm_eps": -1e-6}, "rms_norm_eps: expected a number > 0.0"),
    ("eps-text", {"rms_norm_eps": "1e-6"}, "rms_norm_eps: expected a finite number, got str"),
    ("rope-base-0", {"rope_theta": 0}, "rope_theta: expected a number > 0.0"),
    ("rope-base-nan", {"rope_theta": float("nan")}, "rope_theta: expected a finite number"),
    ("rope-base-inf", {"rope_theta": float("inf")}, "rope_theta: expected a finite number"),
    ("rope-scaling-list", {"rope_scaling": [8.0]}, "rope_scaling: expected an object, got list"),
    (
        "linear-no-factor",
        {"rope_scaling": {"rope_type": "linear"}},
        "rope_scaling.factor: missing (rope type 'linear' needs it)",
    ),
    (
        "linear-factor-0",
        {"rope_scaling": {"rope_type": "linear", "factor": 0.0}},
        "rope_scaling.factor: expected a number > 0.0",
    ),
    (
        "llama3-no-low-factor",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
        "rope_scaling.low_freq_factor: missing (rope type 'llama3' needs it)",
    ),
    (
        "llama3-equal-factors",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 2.0,
                "high_freq_factor": 2.0,
                "original_max_position_embeddings": 16,
            }
        },
        "high_freq_factor 2.0 is not above low_freq_factor 2.0",
    ),
    (
        "longrope-no-long-factor",
        {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}},
        "rope_scaling.long_factor: missing (rope type 'longrope' needs it)",
    ),
    (
        "longrope-short-list",
        {
            "original_max_position_embeddings": 16,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
        },
        "short_factor: 1 factors, but 16 rotary dimensions need 8",
    ),
    (
        "longrope-null-factor",
        {"rope_scaling": {"type": "longrope", "short_factor": [1.0, None], "long_factor": [1]}},
        "rope_scaling.short_factor: [1]: expected a finite number, got NoneType None",
    ),
    (
        "gemma-sets-not-objects",
        {"rope_parameters": {"full_attention": 5}},
        "rope_parameters.full_attention: expected an object, got int 5",
    ),
    ("softcap-negative", {"final_logit_softcapping": -1.0}, "final_logit_softcapping: expected"),
    ("tied-text", {"tie_word_embeddings": "false"}, "tie_word_embeddings: expected a boolean"),
    ("eos-negative", {"eos_token_id": -5}, "eos_token_id: expected an integer between 0"),
    ("eos-text", {"eos_token_id": ["<eos>"]}, "eos_token_id: expected an integer, got str"),
]


@pytest.mark.parametrize(
    ("changes", "match"), [pytest.param(c, m, id=i) for i, c, m in BAD_CONFIGS]
)
def test_a_bad_config_value_is_an_error_line_naming_the_key(
    folder, tmp_path, capsys, changes, match
):
    _edit_config(folder, **changes)
    err = _cli_import(folder, tmp_path / "out", capsys)
    assert "config.json: " in err and match in err, err


def test_a_sliding_window_of_a_trillion_is_refused_at_import(folder, tmp_path, capsys):
    """Before: the import succeeded, and ``run`` then asked for 116 TiB of window caches."""
    _edit_config(folder, sliding_window=10**12)
    err = _cli_import(folder, tmp_path / "out", capsys)
    assert (
        "config.json: sliding_window: expected an integer between 0 and 2097152, got 1000000000000"
    ) in err


def _oversized(path: Path) -> None:
    with open(path, "r+b") as f:  # sparse: no disk written
        f.truncate((256 << 20) + 1)


BAD_FILES: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "tokenizer-over-256MiB",
        lambda d: _oversized(d / "tokenizer.json"),
        r"tokenizer.json: not a usable tokenizer file (file is 268435457 bytes, over the limit",
    ),
    (
        "tokenizer-not-utf8",
        lambda d: (d / "tokenizer.json").write_bytes(b'{"model": "\xff\xfe"}'),
        "tokenizer.json: not a usable tokenizer file ('utf-8' codec can't decode byte 0xff",
    ),
    (
        "tokenizer-config-not-utf8",
        lambda d: (d / "tokenizer_config.json").write_bytes(b'{"eos_token": "\xc3("}'),
        "tokenizer_config.json: not a usable tokenizer file ('utf-8' codec can't decode",
    ),
    (
        "tokenizer-not-json",
        lambda d: (d / "tokenizer.json").write_text("{model"),
        "tokenizer.json: not a usable tokenizer file (Expecting property name",
    ),
    (
        "config-not-an-object",
        lambda d: (d / "config.json").write_text("[1, 2]"),
        "config.json: expected a JSON object, found list",
    ),
    (
        "config-not-json",
        lambda d: (d / "config.json").write_text("{nope"),
        "config.json: not readable JSON",
    ),
    (
        "config-missing",
        lambda d: (d / "config.json").unlink(),
        "not a Hugging Face checkpoint folder (no config.json)",
    ),
    (
        "safetensors-a-folder",
        lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors").mkdir()),
        "model.safetensors: not a regular file (a folder)",
    ),
]


@pytest.mark.parametrize(("edit", "match"), [pytest.param(e, m, id=i) for i, e, m in BAD_FILES])
def test_a_bad_file_is_an_error_line_naming_it(folder, tmp_path, capsys, edit, match):
    edit(folder)
    err = _cli_import(folder, tmp_path / "out", capsys)
    assert match in err, err


def test_a_fifo_named_model_safetensors_is_refused_not_read(folder, tmp_path):
    """Before: the import blocked forever opening the FIFO."""
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    cmd = [sys.executable, "-m", "genai_runtime", "import", str(folder), str(tmp_path / "out")]
    code, err, seconds, _ = run_limited(cmd, timeout=20)
    assert code == 1 and "Traceback" not in err, (code, seconds, err[-2000:])
    assert "model.safetensors: not a regular file (a FIFO)" in err
    assert not (tmp_path / "out").exists()


# -- one bounds table for both formats --------------------------------------------------------

# GGUF "{arch}." key -> the config.json key for the same quantity.
SAME_QUANTITY = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "vocab_size": "vocab_size",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "final_logit_softcapping": "final_logit_softcapping",
    "attn_logit_softcapping": "attn_logit_softcapping",
}


@pytest.mark.parametrize(("gguf_key", "hf_key"), SAME_QUANTITY.items())
def test_gguf_and_hugging_face_imports_share_one_bounds_table(gguf_key, hf_key):
    from genai_runtime.importer import bounds, gguf_checks, hf_checks

    gguf_rule, hf_rule = gguf_checks.ARCH_KEYS[gguf_key], hf_checks.CONFIG_KEYS[hf_key]
    assert gguf_rule == hf_rule and gguf_rule.__self__ in vars(bounds.SHAPES).values()
    for value in (0, -1, 2**31, 10**12, 1.5, float("nan"), "8", [8], True):
        assert gguf_rule(value) == hf_rule(value)


def test_real_config_shapes_still_import(folder, tmp_path):
    """What released configs hold: null for unset keys, Qwen's window past the context with
    sliding off, ints where floats are meant, Llama 3.1's rope scaling."""
    _edit_config(
        folder,
        sliding_window=131072,
        use_sliding_window=False,
        max_window_layers=28,
        head_dim=None,
        rope_theta=500000,
        final_logit_softcapping=None,
        pad_token_id=None,
        eos_token_id=[373, 372],
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    )
    import_model(folder, tmp_path / "out")
    assert (tmp_path / "out" / "model.onnx").is_file()


# -- fuzz target ------------------------------------------------------------------------------

# config.json keys transformers writes for these families (and the importer reads).
FUZZ_KEYS = [
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "tie_word_embeddings",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
]
ROPE_KEYS = [
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
    "short_factor",
    "long_factor",
    "attention_factor",
    "full_attention",
    "sliding_attention",
]
_INTS = st.one_of(
    st.integers(-2, 300),
    st.sampled_from([2**31, 2**32, 10**7, 10**12, 2**63, -(2**31)]),
    st.integers(-(2**70), 2**70),
)
_SCALARS = st.one_of(
    _INTS,
    st.floats(),  # NaN and infinities too: Python's json reads and writes them
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["default", "linear", "llama3", "longrope", "su", "yarn", "sliding_attention"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=12),
        st.dictionaries(st.sampled_from(ROPE_KEYS) | st.text(max_size=6), inner, max_size=5),
    ),
    max_leaves=16,
)
_DTYPES = st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "BOOL", "F8_E4M3", "X", ""])


# Where an edit lands: a top-level key, or a key inside a rope parameter set.
_ROPE_SETS = st.sampled_from(
    [("rope_scaling",), ("rope_parameters",)]
    + [
        (k, t)
        for k in ("rope_scaling", "rope_parameters")
        for t in ("full_attention", "sliding_attention")
    ]
)
_WHERE = st.one_of(
    st.tuples(st.sampled_from(FUZZ_KEYS) | st.text(max_size=8)),
    st.builds(lambda at, key: (*at, key), _ROPE_SETS, st.sampled_from(ROPE_KEYS)),
)
_ROPE_VALUES = st.one_of(
    st.sampled_from(["default", "linear", "llama3", "longrope", "su", "yarn"]),
    st.floats(0, 10),
    st.integers(0, 40),
    st.lists(st.floats(0.5, 4), max_size=10),
)


@st.composite
def _config_edits(draw) -> list[tuple[tuple[str, ...], Any]]:
    """(key path, value) to set (a value of ``...``: drop the key)."""
    edits = []
    for _ in range(draw(st.integers(0, 3))):
        where = draw(_WHERE)
        values = _VALUES | st.just(...) if len(where) == 1 else _ROPE_VALUES | _VALUES
        edits.append((where, draw(values)))
    return edits


def _edited(config: dict[str, Any], edits: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    doc = json.loads(json.dumps(config))
    for where, value in edits:
        node = doc
        for key in where[:-1]:  # a rope set that is not an object becomes one
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if value is ...:
            node.pop(where[-1], None)
        else:
            node[where[-1]] = value
    return doc


@st.composite
def _header_edits(draw, names: list[str]) -> list[tuple[str, Any, Any]]:
    edits = []
    for _ in range(draw(st.integers(0, 2))):
        what = draw(st.sampled_from(["dtype", "shape", "offsets", "drop", "rename", "raw"]))
        name = draw(st.sampled_from(names))
        if what == "dtype":
            value = draw(_DTYPES | _VALUES)
        elif what == "shape":
            value = draw(st.lists(_INTS, max_size=4) | _VALUES)
        elif what == "offsets":
            value = draw(st.lists(_INTS, min_size=2, max_size=2) | _VALUES)
        elif what == "rename":
            value = draw(st.text(max_size=40))
        elif what == "raw":  # the whole header, the length prefix, or the file's length
            name = draw(st.sampled_from(["doc", "length", "cut", "metadata"]))
            value = draw(_INTS if name in ("length", "cut") else _VALUES)
        else:
            value = None
        edits.append((what, name, value))
    return edits


def _safetensors(raw: bytes, edits: list[tuple[str, Any, Any]]) -> bytes:
    """``raw`` with its JSON header edited (written from the format: u64 length, JSON, data)."""
    (n,) = struct.unpack("<Q", raw[:8])
    header: Any = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    length = cut = None
    for what, name, value in edits:
        if what == "raw":
            if name == "doc":
                header = value
            elif name == "metadata" and isinstance(header, dict):
                header["__metadata__"] = value
            elif name == "length":
                length = value % 2**64
            elif name == "cut":
                cut = value
            continue
        if not isinstance(header, dict) or name not in header:
            continue
        if what == "drop":
            del header[name]
        elif what == "rename":
            header[value] = header.pop(name)
        elif isinstance(header[name], dict):
            header[name][{"offsets": "data_offsets"}.get(what, what)] = value
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    out = struct.pack("<Q", len(text) if length is None else length) + text + data
    return out if cut is None else out[:cut]


@contextlib.contextmanager
def _address_space_headroom(extra: int) -> Iterator[None]:
    """This process may map only ``extra`` bytes more while inside (an unbounded allocation is
    a MemoryError, not a machine out of memory)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    cap = mapped + extra if hard == resource.RLIM_INFINITY else min(hard, mapped + extra)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class TooSlow(Exception):
    """An example ran past its time limit (not a GenaiRuntimeError: the fuzz target fails)."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Stop the example (SIGALRM) once it runs ``seconds``: a hang fails instead of waiting."""

    def expire(signum: int, frame: Any) -> None:
        raise TooSlow(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fuzz_settings():
    extra = int(os.environ.get("HF_FUZZ_EXAMPLES", "0"))
    return settings(
        max_examples=extra or 70,
        derandomize=not extra,  # CI: the same examples every run; a long run: fresh ones
        deadline=None,  # timed below, per example, with the import included
        database=None,
        # CI: a failure is reported as found (shrinking reruns slow examples many times).
        phases=[p for p in Phase if extra or p is not Phase.shrink],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("arch", ["llama", "phi3", "gemma3"])  # plain, longrope, rope sets
def test_fuzz_hugging_face_folders(tmp_path_factory, tmp_path, arch):
    """Random config.json values and safetensors header edits of a valid tiny folder: each
    imports or is refused with a GenaiRuntimeError that is not a disguised MemoryError, in a
    few seconds, allocating at most 64 MiB while the folder is opened."""
    from genai_runtime.importer.hf_folder import HFCheckpoint

    work = H.write_hf(tmp_path / "hf", arch)
    config = json.loads((work / "config.json").read_text())
    raw = (work / "model.safetensors").read_bytes()
    names = sorted(json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]]))
    outcomes = {"imported": 0, "refused": 0}

    @_fuzz_settings()
    @given(_config_edits(), _header_edits(names))
    def one(config_edits, header_edits) -> None:
        (work / "config.json").write_text(json.dumps(_edited(config, config_edits)))
        (work / "model.safetensors").write_bytes(_safetensors(raw, header_edits))
        start = time.monotonic()
        with _address_space_headroom(2 << 30), _time_limit(5):
            tracemalloc.start()
            try:
                try:
                    HFCheckpoint(work)
                finally:
                    peak = tracemalloc.get_traced_memory()[1]
                    tracemalloc.stop()
                import_model(work, tmp_path / "out", force=True)
                outcomes["imported"] += 1
            except GenaiRuntimeError as exc:
                assert not isinstance(exc.__cause__, MemoryError), exc
                outcomes["refused"] += 1
        seconds = time.monotonic() - start
        assert seconds < 5, f"{seconds:.1f} s for {config_edits} {header_edits}"
        assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB for {config_edits} {header_edits}"

    one()
    print(f"HF fuzz: {outcomes}")
    assert outcomes["imported"] and outcomes["refused"]  # both paths were exercised


def test_model_error_is_what_a_bad_folder_raises(folder, tmp_path):
    """The API form: ``import_model`` raises ModelError (a GenaiRuntimeError) naming the key."""
    _edit_config(folder, num_attention_heads=0)
    with pytest.raises(ModelError, match=r"config\.json: num_attention_heads: expected"):
        import_model(folder, tmp_path / "out")
