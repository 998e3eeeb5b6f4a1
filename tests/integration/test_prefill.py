"""Prompt processing variants give the same greedy tokens as the plain run: chunked prefill
(``search.chunk_size``) on the real SmolLM2 model."""

from __future__ import annotations

from pathlib import Path

import pytest

import genai_runtime as og

PROMPT = (
    "The history of the printing press begins in the fifteenth century, when movable type made "
    "books cheaper and faster to produce than ever before. Scholars, merchants and clergy all "
    "wanted copies, and within a few decades presses had spread across Europe. Newspapers, "
    "pamphlets and maps followed, literacy rose, and ideas travelled further than any single "
    "voice could carry them. Explain briefly"
)


def _greedy(model: og.Model, ids, **options) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + 12, **options)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return generator.get_sequence(0).tolist()


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> og.Model:
    return og.Model(smollm2_dir)


@pytest.fixture(scope="module")
def prompt_ids(smollm2: og.Model):
    ids = og.Tokenizer(smollm2).encode(PROMPT)
    assert len(ids) > 64  # every chunk size splits the prompt
    return ids


@pytest.fixture(scope="module")
def unchunked(smollm2: og.Model, prompt_ids) -> list[int]:
    return _greedy(smollm2, prompt_ids)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_gives_the_unchunked_tokens(
    smollm2: og.Model, prompt_ids, unchunked: list[int], chunk: int
) -> None:
    assert _greedy(smollm2, prompt_ids, chunk_size=chunk) == unchunked
