"""``response_format`` -> a grammar op for one request (json_schema / json_object, llguidance)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import GenaiRuntimeError
from .protocol import APIError, bad


def json_grammar(model: Any, fmt: Mapping[str, Any]) -> Any:
    """A batch-1 ``Grammar`` constraining the reply to the format's JSON schema."""
    from ..decoding.guidance import Grammar

    if fmt["type"] == "json_object":
        schema: Any = {"type": "object"}
    else:
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise bad(
                'response_format.json_schema must be an object with a "schema" object',
                "response_format",
            )
        schema = spec["schema"]
    spec = model.spec
    if spec.model_dir is None or model.vocab_size is None:
        raise bad("this model has no tokenizer.json for constrained decoding", "response_format")
    try:
        return Grammar(
            "json_schema", schema, tokenizer_json=spec.model_dir / "tokenizer.json",
            vocab_size=model.vocab_size, eos_token_ids=spec.tokens.eos, batch_size=1,
            where="response_format",
        )  # fmt: skip
    except APIError:
        raise
    except GenaiRuntimeError as exc:
        raise bad(str(exc)[:500], "response_format") from None
