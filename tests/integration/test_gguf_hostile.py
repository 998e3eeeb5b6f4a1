"""Issue 23 item 8: hostile GGUF metadata is a ModelError naming the file and the key, before
anything is allocated from it; unused metadata arrays cost nothing; and a bounded hypothesis
fuzz target over the header of a tiny GGUF (every outcome a GenaiRuntimeError or a good import).

``GGUF_FUZZ_EXAMPLES=N`` runs the fuzz target longer, with fresh random examples."""

from __future__ import annotations

import math
import os
import struct
import tracemalloc

import pytest

from genai_runtime.errors import GenaiRuntimeError, ModelError
from genai_runtime.importer import import_gguf
from genai_runtime.importer.gguf_file import GGUFModel

gguf_models = pytest.importorskip("gguf_models", reason="needs the gguf extra")
hypothesis = pytest.importorskip("hypothesis")
from gguf_header import (  # noqa: E402
    ARRAY,
    BOOL,
    FLOAT32,
    STRING,
    UINT32,
    UINT64,
    Header,
    RawItems,
    emit,
    parse,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return gguf_models.write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "t.gguf").read_bytes()


def _with(raw: bytes, edit) -> bytes:
    header = parse(raw)
    edit(header)
    return emit(header)


def _set(key: str, kind: int, value) -> object:
    return lambda h: h.kv.__setitem__(key, (kind, value))


def _token(i: int, text: bytes):
    def edit(h: Header) -> None:
        item, tokens = h.kv["tokenizer.ggml.tokens"][1]
        tokens[i] = text
        h.kv["tokenizer.ggml.tokens"] = (ARRAY, (item, tokens))

    return edit


def _tensor(field: int, value):
    def edit(h: Header) -> None:
        h.tensors[0][field] = value

    return edit


HOSTILE = [
    ("alignment-0", _set("general.alignment", UINT32, 0), r"general\.alignment is int 0"),
    ("alignment-7", _set("general.alignment", UINT32, 7), r"general\.alignment is int 7"),
    (
        "head-count-0",
        _set("llama.attention.head_count", UINT32, 0),
        r"head_count: expected an integer between 1",
    ),
    (
        "head-count-text",
        _set("llama.attention.head_count", STRING, "4"),
        r"head_count: expected an integer, got str '4'",
    ),
    (
        "width-float",
        _set("llama.embedding_length", FLOAT32, 64.0),
        r"embedding_length: expected an integer, got float",
    ),
    (
        "kv-heads-3-of-4",
        _set("llama.attention.head_count_kv", UINT32, 3),
        r"head_count_kv: 3 does not divide head_count 4",
    ),
    (
        "context-2^40",
        _set("llama.context_length", UINT64, 2**40),
        r"context_length: expected an integer between 1 and 2097152, got 1099511627776",
    ),
    (
        "context-0",
        _set("llama.context_length", UINT32, 0),
        r"context_length: expected an integer between 1",
    ),
    (
        "block-count-2^31",
        _set("llama.block_count", UINT32, 2**31),
        r"block_count: expected an integer between 1 and 4096",
    ),
    (
        "block-count-past-tensors",
        _set("llama.block_count", UINT32, 4000),
        r"block_count: 4000 layers but only \d+ tensors",
    ),
    (
        "eps-nan",
        _set("llama.attention.layer_norm_rms_epsilon", FLOAT32, math.nan),
        r"epsilon: expected a finite number, got float nan",
    ),
    (
        "rope-base-0",
        _set("llama.rope.freq_base", FLOAT32, 0.0),
        r"freq_base: expected a number > 0",
    ),
    (
        "rope-base-negative",
        _set("llama.rope.freq_base", FLOAT32, -1.0),
        r"freq_base: expected a number > 0",
    ),
    (
        "rope-dims-odd",
        _set("llama.rope.dimension_count", UINT32, 15),
        r"dimension_count: 15; expected an even number",
    ),
    (
        "eos-10^9",
        _set("tokenizer.ggml.eos_token_id", UINT32, 10**9),
        r"eos_token_id: expected an integer between 0 and 263, got 1000000000",
    ),
    (
        "add-bos-int",
        _set("tokenizer.ggml.add_bos_token", UINT32, 1),
        r"add_bos_token: expected a boolean",
    ),
    (
        "template-bad-utf8",
        _set("tokenizer.chat_template", STRING, b"{{ x }}\xff\xfe"),
        r"chat_template: not valid UTF-8 at character 7",
    ),
    ("token-bad-utf8", _token(40, b"\xc3("), r"tokenizer\.ggml\.tokens\[40\]: not valid UTF-8"),
    (
        "scores-short",
        _set("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0] * 3)),
        r"scores: 3 values for 264 tokens",
    ),
    ("tensor-offset-unaligned", _tensor(3, 1), r"starts at offset 1, not a multiple of 32"),
    ("tensor-5-dims", _tensor(1, [64, 1, 1, 1, 1]), r"has 5 dimensions"),
    (
        "tensor-count-2^40",
        lambda h: setattr(h, "n_tensors", 2**40),
        r"declares 1099511627776 tensors",
    ),
]


@pytest.mark.parametrize(("edit", "match"), [pytest.param(e, m, id=i) for i, e, m in HOSTILE])
def test_hostile_metadata_is_a_model_error_naming_the_key(tiny_bytes, tmp_path, edit, match):
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_with(tiny_bytes, edit))
    with pytest.raises(ModelError, match=match) as info:
        import_gguf(path, tmp_path / "out")
    assert str(path) in str(info.value) and not (tmp_path / "out").exists()


def test_a_string_array_claiming_more_items_than_the_file_holds(tiny_bytes, tmp_path):
    """8 bytes of count, 2^40 items: refused before a list of 2^40 is started."""
    raw = _with(tiny_bytes, _set("junk.strings", ARRAY, (STRING, [])))
    count = struct.pack("<Q", 0)
    at = raw.index(b"junk.strings") + len("junk.strings") + 8  # after the key: type, item type
    raw = raw[:at] + struct.pack("<Q", 2**40) + raw[at + len(count) :]
    path = tmp_path / "h.gguf"
    path.write_bytes(raw)
    with pytest.raises(ModelError, match="header ends at byte"):
        GGUFModel(path)


def test_unused_metadata_arrays_cost_no_memory(tiny_bytes, tmp_path):
    """38 MiB of unused arrays (numbers, and 10,000 short strings): the header is read in a
    few MiB (before: ~10x the arrays' size as Python objects)."""
    junk = {
        "junk.numbers": (ARRAY, (0, RawItems(38 << 20, bytes(38 << 20)))),
        "junk.words": (ARRAY, (STRING, RawItems(10**4, (struct.pack("<Q", 2) + b"ab") * 10**4))),
    }
    raw = _with(tiny_bytes, lambda h: h.kv.update(junk))
    path = tmp_path / "junk.gguf"
    path.write_bytes(raw)
    del raw
    tracemalloc.start()
    try:
        model = GGUFModel(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB while reading the header"
    assert len(model.vocab().tokens) == 264


# -- fuzz target ------------------------------------------------------------------------------

_INTS = st.one_of(
    st.integers(0, 300),
    st.sampled_from([2**31, 2**32 - 1, 2**40, 2**63]),
    st.integers(0, 2**64 - 1),
)
_VALUES = st.one_of(
    st.tuples(st.just(UINT32), st.integers(0, 2**32 - 1)),
    st.tuples(st.just(UINT64), _INTS),
    st.tuples(st.just(FLOAT32), st.floats(width=32)),
    st.tuples(st.just(BOOL), st.booleans()),
    st.tuples(st.just(STRING), st.binary(max_size=24)),
    st.tuples(
        st.just(ARRAY), st.tuples(st.just(UINT32), st.lists(st.integers(0, 2**32 - 1), max_size=6))
    ),
    st.tuples(
        st.just(ARRAY), st.tuples(st.just(STRING), st.lists(st.binary(max_size=6), max_size=4))
    ),
    # an array whose count claims more items than follow it
    st.tuples(
        st.just(ARRAY),
        st.tuples(
            st.sampled_from([UINT32, UINT64, STRING]), st.builds(RawItems, _INTS, st.just(b""))
        ),
    ),
)


@st.composite
def _mutations(draw, keys: list[str], n_tensors: int):
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["kv", "kv", "kv", "drop", "tensor", "count", "version"]))
        if what == "kv":
            key = draw(st.sampled_from(keys) | st.text(max_size=12))
            edits.append(("kv", key, draw(_VALUES)))
        elif what == "drop":
            edits.append(("drop", draw(st.sampled_from(keys)), None))
        elif what == "tensor":
            i = draw(st.integers(0, n_tensors - 1))
            field = draw(st.sampled_from([1, 2, 3]))
            value = (
                draw(st.lists(_INTS, min_size=0, max_size=6))
                if field == 1
                else draw(_INTS if field == 3 else st.integers(0, 40))
            )
            edits.append(("tensor", (i, field), value))
        else:
            edits.append((what, None, draw(_INTS if what == "count" else st.integers(0, 5))))
    return edits


def _apply(raw: bytes, edits) -> bytes:
    h = parse(raw)
    for what, where, value in edits:
        if what == "kv":
            h.kv[where] = value
        elif what == "drop":
            h.kv.pop(where, None)
        elif what == "tensor":
            h.tensors[where[0]][where[1]] = value
        elif what == "count":
            h.n_kv = value
        else:
            h.version = value
    return emit(h)


def _fuzz_settings():
    extra = int(os.environ.get("GGUF_FUZZ_EXAMPLES", "0"))
    return settings(
        max_examples=extra or 40,
        derandomize=not extra,  # CI: the same examples every run; a long run: fresh ones
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def test_fuzz_gguf_headers(tiny_bytes, tmp_path):
    """Random edits of a valid tiny GGUF's header: each file loads (and then imports), or is
    refused with a GenaiRuntimeError that is not a disguised MemoryError; reading the header
    never allocates more than 64 MiB."""
    original = parse(tiny_bytes)
    keys, n_tensors = sorted(original.kv), len(original.tensors)
    path = tmp_path / "fuzz.gguf"

    @_fuzz_settings()
    @given(_mutations(keys, n_tensors))
    def one(edits) -> None:
        path.write_bytes(_apply(tiny_bytes, edits))
        tracemalloc.start()
        try:
            try:
                model = GGUFModel(path)
            except GenaiRuntimeError as exc:
                assert not isinstance(exc.__cause__, MemoryError), exc
                return
            finally:
                peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB for {edits}"
        try:
            model.vocab()
            import_gguf(path, tmp_path / "out", force=True)
        except GenaiRuntimeError as exc:
            assert not isinstance(exc.__cause__, MemoryError), exc

    one()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("zzzq qqqz", r"merges\[\d+\] 'zzzq qqqz' names 'zzzq', which is not in the vocabulary"),
        ("nospace", r"merges\[\d+\] 'nospace' is not two pieces apart by one space"),
    ],
)
def test_a_merge_naming_an_unknown_piece_is_refused_at_import(tmp_path, monkeypatch, extra, match):
    """Before, such a GGUF imported and its tokenizer failed to load only at ``run``."""
    import gguf_models

    tiny_vocab = gguf_models.tiny_vocab

    def with_bad_merge():
        tokens, merges = tiny_vocab()
        return tokens, [*merges, extra]

    monkeypatch.setattr(gguf_models, "tiny_vocab", with_bad_merge)
    path = gguf_models.write_tiny_gguf(tmp_path / "bad-merge.gguf")
    with pytest.raises(ModelError, match=match):
        import_gguf(path, tmp_path / "out", quant="fp32")
    assert not (tmp_path / "out").exists()
