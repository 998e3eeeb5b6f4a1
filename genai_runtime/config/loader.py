"""Find, read and validate a genai_config (v1 or v2), reporting every problem with its path.

The loader only reads and checks documents: v1 -> v2 translation and presets live elsewhere.
Schema errors are rewritten into short messages that say where, what was expected and what
was found, e.g. ``search.top_k: expected an integer >= 0, got 1.5``.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checks import is_number
from ..errors import ConfigError, ConfigProblem
from . import validated
from .bounded import CONFIG_LIMITS, LimitError, clip_text, load_json, load_yaml, read_bounded
from .pulled import cache_root, is_model_name, pulled_folder
from .resources import resource_dir

if TYPE_CHECKING:  # jsonschema is imported only when a config is not known to be valid
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError
    from referencing import Registry

CONFIG_NAMES = ("genai_config.json", "genai_config.yaml", "genai_config.yml")
SUPPORTED_VERSIONS = (1, 2)
_YAML_SUFFIXES = (".yaml", ".yml")

# Bounds the schemas put on every integer (the reference's int32/int64 range checks); they are
# real constraints but noise in an "expected ..." phrase, so they are left out of it.
_IMPLICIT_BOUNDS = {-(2**31), 2**31 - 1, -(2**63), 2**63 - 1}
_MAX_VALUE_CHARS = 40
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_$-]+$")
_SCALAR_LIMITS = {
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "pattern",
    "minLength",
    "maxLength",
}

PathParts = Sequence[str | int]


@dataclass(frozen=True)
class LoadedDocument:
    """A validated config document, its format version, its file and the model folder."""

    doc: dict
    version: int
    path: Path
    model_dir: Path


# ---------------------------------------------------------------------------------------------
# Schemas


def schema_path(version: int) -> Path:
    """The JSON Schema file for a config version (installed package first, then the checkout)."""
    return resource_dir("schemas") / f"genai_config.v{version}.schema.json"


@cache
def _schema(version: int) -> dict:
    return json.loads(schema_path(version).read_text(encoding="utf-8"))


def load_schema(version: int) -> dict:
    """The parsed JSON Schema for ``version`` (a copy: callers may modify it)."""
    if version not in SUPPORTED_VERSIONS:
        raise _version_error(version)
    return copy.deepcopy(_schema(version))


@cache
def _registry() -> Registry:
    from referencing import Registry, Resource

    # Both schemas under their $id, so a $ref across files resolves offline.
    resources = [
        (_schema(v)["$id"], Resource.from_contents(_schema(v))) for v in SUPPORTED_VERSIONS
    ]
    return Registry().with_resources(resources)


@cache
def _validator(version: int) -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_schema(version), registry=_registry())


def _deref(schema: Any, version: int) -> Any:
    """Follow ``$ref`` until reaching a schema that has none."""
    resolver = _registry().resolver(base_uri=_schema(version)["$id"])
    while isinstance(schema, dict) and "$ref" in schema:
        schema = resolver.lookup(schema["$ref"]).contents
    return schema


def _schema_at(version: int, steps: Iterable[str | int]) -> Any:
    """The subschema at a jsonschema ``schema_path`` (which omits the ``$ref`` hops)."""
    node: Any = _schema(version)
    for step in steps:
        if step == "$ref":
            node = _deref(node, version)
            continue
        if isinstance(node, dict) and step not in node and "$ref" in node:
            node = _deref(node, version)
        node = node[step]
    return _deref(node, version)


def _types(schema: dict) -> list[str]:
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else list(types)


# ---------------------------------------------------------------------------------------------
# Finding and reading files


def find_config_file(path: str | Path) -> Path:
    """The config file for ``path``: a file itself, genai_config.json/.yaml/.yml in a folder, or
    the config of a pulled model when ``path`` is a model name (``genai-runtime pull NAME``)."""
    if not isinstance(path, str | Path) or isinstance(path, bool):
        message = f"expected a model folder or config file path, got {type(path).__name__}"
        raise ConfigError.at("", message)
    p = pulled_folder(path) or Path(path).expanduser()
    shown = clip_text(str(p))
    try:
        if p.is_dir():
            for name in CONFIG_NAMES:
                if (p / name).is_file():
                    return p / name
            wanted = ", ".join(CONFIG_NAMES[:-1]) + f" or {CONFIG_NAMES[-1]}"
            raise ConfigError.at("", f"no {wanted} in folder {shown}", shown)
        if p.is_file():
            return p
    except (OSError, ValueError) as exc:  # name too long, NUL byte in the name...
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError.at("", f"cannot use path {shown}: {reason}") from None
    message = f"{shown} does not exist (expected a model folder or a config file)"
    if is_model_name(str(path)):
        message = (
            f"{shown} is neither a model folder, a config file nor a pulled model (nothing named "
            f"so in {clip_text(str(cache_root()))}; genai-runtime pull --list names the models "
            "pull can fetch)"
        )
    raise ConfigError.at("", message, shown)


def read_document(path: str | Path) -> tuple[dict, Path]:
    """Read a config (JSON, or YAML by suffix) and return it with the file it came from."""
    file = find_config_file(path)
    source = str(file)
    try:
        # builder files may start with a BOM
        text = read_bounded(file, CONFIG_LIMITS.max_bytes, encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError, LimitError) as exc:
        message = f"cannot read file: {clip_text(str(exc), 200)}"
        raise ConfigError.at("", message, source) from None
    if file.suffix.lower() in _YAML_SUFFIXES:
        doc = _parse_yaml(text, source)
    else:
        doc = _parse_json(text, source)
    if not isinstance(doc, dict):
        message = f"expected an object at the top level, got {_got(doc)}"
        raise ConfigError.at("", message, source)
    return doc, file


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json_text(text: str, source: str) -> Any:
    """A config JSON document from text, bounded and strict; ``ConfigError`` on any problem."""
    return _parse_json(text, source)


def _parse_json(text: str, source: str) -> Any:
    duplicated: dict[int, list[str]] = {}  # id(object) -> keys it repeats

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            seen: set[str] = set()
            duplicated[id(obj)] = [k for k, _ in pairs if k in seen or seen.add(k)]
        return obj

    try:
        doc = load_json(
            text, CONFIG_LIMITS, parse_constant=_reject_constant, object_pairs_hook=pairs_hook
        )
    except json.JSONDecodeError as exc:
        message = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        raise ConfigError.at("", message, source) from None
    except LimitError as exc:
        raise ConfigError.at("", f"JSON refused: {exc}", source) from None
    except ValueError as exc:
        raise ConfigError.at("", f"invalid JSON: {exc}", source) from None
    if duplicated:  # json.loads keeps the last of repeated keys: silently losing the others
        problems = [
            ConfigProblem(json_path([*parts, key]), "key repeated in the same object")
            for parts, obj in _objects(doc, [])
            for key in duplicated.get(id(obj), ())
        ]
        raise ConfigError(problems, source)
    return doc


def _objects(node: Any, parts: list[str | int]) -> Iterable[tuple[list[str | int], dict]]:
    """Every JSON object in a document, with its path."""
    if isinstance(node, dict):
        yield parts, node
        for key, value in node.items():
            yield from _objects(value, [*parts, key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects(value, [*parts, i])


def _parse_yaml(text: str, source: str) -> Any:
    import yaml  # only YAML configs need it

    try:
        doc = load_yaml(text, CONFIG_LIMITS)
    except LimitError as exc:
        raise ConfigError.at("", f"YAML refused: {exc}", source) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        message = f"invalid YAML{where}: {exc.problem or exc.context}"
        raise ConfigError.at("", message, source) from None
    except yaml.YAMLError as exc:
        raise ConfigError.at("", f"invalid YAML: {exc}", source) from None
    # YAML allows keys JSON cannot express (1: x, null: y); the schemas assume strings.
    problems = list(_non_string_keys(doc, []))
    if problems:
        raise ConfigError(problems, source)
    return doc


def _non_string_keys(node: Any, parts: list[str | int]) -> Iterable[ConfigProblem]:
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                yield ConfigProblem(json_path(parts), f"keys must be strings, got {_got(key)}")
            else:
                yield from _non_string_keys(value, [*parts, key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _non_string_keys(value, [*parts, i])


# ---------------------------------------------------------------------------------------------
# Version, overlay, load


def config_version(doc: Mapping[str, Any]) -> int:
    """The format version of a document: absent -> 1, else 1 or 2."""
    if "version" not in doc:
        return 1
    version = doc["version"]
    if not is_number(version):
        raise _version_error(version)
    if version not in SUPPORTED_VERSIONS:
        raise _version_error(version)
    return int(version)


def _version_error(value: Any) -> ConfigError:
    supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
    if is_number(value):
        message = f"unsupported config version {_got(value)} (supported versions: {supported})"
    else:
        message = f"expected a config version ({supported}), got {_got(value)}"
    return ConfigError.at("version", message)


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict:
    """``overlay`` laid over ``base``: objects merge key by key, anything else replaces.

    Neither input is modified and the result shares no mutable parts with them.
    """
    out = {key: copy.deepcopy(value) for key, value in base.items()}
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _parse_overlay(overlay: Mapping[str, Any] | str) -> Mapping[str, Any]:
    if isinstance(overlay, str):
        overlay = _parse_json(overlay, "config overlay")
    if not isinstance(overlay, Mapping):
        message = f"expected an object at the top level, got {_got(overlay)}"
        raise ConfigError.at("", message, "config overlay")
    return overlay


def load_document(
    path: str | Path, overlay: Mapping[str, Any] | str | None = None
) -> LoadedDocument:
    """Find, read, overlay, version and validate a config. Raises ``ConfigError`` on any problem."""
    doc, file = read_document(path)
    if overlay:  # an empty overlay string is no overlay, as in onnxruntime-genai
        doc = deep_merge(doc, _parse_overlay(overlay))
    try:
        version = config_version(doc)
    except ConfigError as exc:
        raise ConfigError(exc.problems, str(file)) from None
    validate_document(doc, version, source=str(file))
    return LoadedDocument(doc=doc, version=version, path=file, model_dir=file.parent)


# ---------------------------------------------------------------------------------------------
# Validation and messages


def validate_document(doc: Any, version: int, source: str | None = None) -> None:
    """Validate ``doc`` against the schema of ``version``; raise one ``ConfigError`` listing
    every problem (sorted by path)."""
    if version not in SUPPORTED_VERSIONS:
        exc = _version_error(version)
        raise ConfigError(exc.problems, source)
    digest = validated.key(doc, version, schema_path(version))
    if validated.known(digest):
        return
    found: dict[tuple, tuple[PathParts, str]] = {}
    for error in _validator(version).iter_errors(doc):
        for parts, message in _explain(error, version):
            found.setdefault((_sort_key(parts), message), (parts, message))
    if found:
        problems = [ConfigProblem(json_path(p), m) for _, (p, m) in sorted(found.items())]
        raise ConfigError(problems, source)
    validated.remember(digest)


def json_path(parts: Iterable[str | int]) -> str:
    """``["model", "decoder", "pipeline", 0]`` -> ``model.decoder.pipeline[0]``.

    Keys that are not plain words (dots, spaces, ...) are quoted: ``session_options["a.b"]``.
    """
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _sort_key(parts: PathParts) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in parts)


def _explain(error: ValidationError, version: int) -> list[tuple[PathParts, str]]:
    """One jsonschema error as (path parts, message) pairs written for people."""
    parts = list(error.absolute_path)
    kind = error.validator
    instance = error.instance
    spath = list(error.absolute_schema_path)

    if "propertyNames" in spath:
        # The instance is the offending key itself; name it in the path.
        what = _describe(error.schema, version, with_bounds=True)
        return [([*parts, instance], f"invalid name {_quote(instance)}: expected {what}")]
    if kind in ("anyOf", "oneOf"):
        return _explain_alternatives(error, version)
    if kind == "additionalProperties":
        schema = error.schema
        known = sorted(schema.get("properties", {}))
        extras = [k for k in instance if k not in schema.get("properties", {})]
        return [([*parts, k], _unknown_key(k, known)) for k in extras]
    if kind == "required":
        missing = [k for k in error.validator_value if k not in instance]
        return [(parts, f"missing required key {_quote(k)}") for k in missing]
    if kind == "type":
        if (
            spath[-2:] == ["additionalProperties", "type"]
            and isinstance(instance, dict | list)
            and not {"object", "array"} & set(_types(error.schema))
        ):
            # An object or array where only scalar entries are accepted: the reference reports
            # an unknown key here (e.g. an unlisted session_options key holding an object).
            parent = _schema_at(version, spath[:-2])
            known = sorted(parent.get("properties", {}))
            others = _describe(error.schema, version, with_bounds=False)
            return [(parts, _unknown_key(parts[-1], known, others))]
        numeric = is_number(instance)
        what = _describe(error.schema, version, with_bounds=numeric, value=instance)
        return [(parts, f"expected {what}, got {_got(instance)}")]
    if kind in ("enum", "const"):
        return [(parts, f"expected {_describe(error.schema, version)}, got {_quote(instance)}")]
    if kind in _SCALAR_LIMITS:
        what = _describe(error.schema, version, with_bounds=True, value=instance)
        return [(parts, f"expected {what}, got {_quote(instance)}")]
    if kind == "minItems":
        n = error.validator_value
        return [(parts, f"expected at least {n} item{'s' * (n != 1)}, got {len(instance)}")]
    if kind == "maxItems":
        n = error.validator_value
        return [(parts, f"expected at most {n} item{'s' * (n != 1)}, got {len(instance)}")]
    if kind == "minProperties":
        return [(parts, f"expected at least {error.validator_value} key(s), got {len(instance)}")]
    if kind == "uniqueItems":
        return [(parts, f"expected unique items, got {_got(instance)}")]
    if kind == "not":
        return [(parts, f"must not be {_describe(error.validator_value, version)}")]
    return [(parts, error.message)]


def _explain_alternatives(error: ValidationError, version: int) -> list[tuple[PathParts, str]]:
    """anyOf/oneOf: report inside the branch the value was evidently meant for, if any."""
    parts = list(error.absolute_path)
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context or ():
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    # A branch is out when the value fails its basic shape (wrong type, not the constant).
    fitting = {
        i: errs
        for i, errs in branches.items()
        if not any(not e.relative_path and e.validator in ("type", "const", "enum") for e in errs)
    }
    candidates = [e for errs in fitting.values() for e in errs]
    only_limits = all(not e.relative_path and e.validator in _SCALAR_LIMITS for e in candidates)
    if not candidates or only_limits:
        # No branch fits, or the value has the right shape but a bad range: name all options.
        what = _describe(error.schema, version, with_bounds=True, value=error.instance)
        return [(parts, f"expected {what}, got {_got(error.instance)}")]
    from jsonschema.exceptions import best_match

    chosen = candidates if len(fitting) == 1 else [best_match(candidates)]
    return [item for sub in chosen for item in _explain(sub, version)]


def _unknown_key(key: str | int, known: list[str], others: str | None = None) -> str:
    """``others``: what unlisted keys may hold where some are allowed (session_options)."""
    hints = []
    if known:
        hints.append(f"expected one of: {', '.join(known)}")
    if others:
        hints.append(f"any other key must hold {others}")
    text = "; ".join(hints) or "no keys are allowed here"
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75)
    if close:
        text = f"did you mean {_quote(close[0])}? {text}"
    return f"unknown key {_quote(key)} ({text})"


# ---------------------------------------------------------------------------------------------
# Describing schemas and values


def _describe(schema: Any, version: int, with_bounds: bool = True, value: Any = None) -> str:
    """A short noun phrase for what ``schema`` accepts: "an integer >= 0", "one of 'a', 'b'".

    ``value`` is the rejected value: the int32/int64 bounds are named only when it breaks them.
    """
    schema = _deref(schema, version)
    if not isinstance(schema, dict):
        return "a valid value"
    if "const" in schema:
        return _quote(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_quote(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [_describe(s, version, with_bounds, value) for s in schema[key]]
            return _join_or(list(dict.fromkeys(options)))
    types = _types(schema)
    if not types:
        return "a valid value"
    return _join_or([_describe_type(t, schema, version, with_bounds, value) for t in types])


def _describe_type(kind: str, schema: dict, version: int, with_bounds: bool, value: Any) -> str:
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        return noun + (_bounds(schema, value) if with_bounds else "")
    if kind == "string":
        if "pattern" in schema and with_bounds:
            hint = schema.get("description", "").strip().rstrip(".")
            if hint:
                return hint[0].lower() + hint[1:]
            return f"a string matching {schema['pattern']}"
        return "a string"
    if kind == "boolean":
        return "a boolean"
    if kind == "null":
        return "null"
    if kind == "array":
        items = _deref(schema.get("items"), version)
        if isinstance(items, dict) and isinstance(items.get("type"), str):
            plural = {"integer": "integers", "number": "numbers", "string": "strings"}
            plural |= {"object": "objects", "boolean": "booleans", "array": "arrays"}
            return f"an array of {plural[items['type']]}"
        return "an array"
    if kind == "object":
        return "an object"
    return f"a {kind}"


def _bounds(schema: dict, value: Any = None) -> str:
    lo = schema.get("minimum")
    hi = schema.get("maximum")
    numeric = is_number(value)
    if lo in _IMPLICIT_BOUNDS and not (numeric and value < lo):
        lo = None
    if hi in _IMPLICIT_BOUNDS and not (numeric and value > hi):
        hi = None
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if lo is not None and hi is not None:
        return f" between {_num(lo)} and {_num(hi)}"
    pieces = []
    if lo is not None:
        pieces.append(f">= {_num(lo)}")
    if xlo is not None:
        pieces.append(f"> {_num(xlo)}")
    if hi is not None:
        pieces.append(f"<= {_num(hi)}")
    if xhi is not None:
        pieces.append(f"< {_num(xhi)}")
    return " " + " and ".join(pieces) if pieces else ""


def _join_or(options: list[str]) -> str:
    if len(options) <= 1:
        return "".join(options)
    return ", ".join(options[:-1]) + " or " + options[-1]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _clip(text: str) -> str:
    return clip_text(text, _MAX_VALUE_CHARS)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _got(value: Any) -> str:
    """A found value with its JSON type where that helps: ``string "5"``, ``1.5``, ``null``."""
    if isinstance(value, bool):
        return f"boolean {_json(value)}"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return _clip(_json(value))
    if isinstance(value, str):
        return f"string {_clip(_json(value))}"
    if isinstance(value, dict):
        return f"object {_clip(_json(value))}"
    if isinstance(value, list):
        return f"array {_clip(_json(value))}"
    return f"{type(value).__name__} {_clip(repr(value))}"


def _quote(value: Any) -> str:
    """A value as written in enum lists and key names: strings in single quotes."""
    if isinstance(value, str):
        return _clip(repr(value)) if "'" in value else _clip(f"'{value}'")
    if is_number(value):
        return _clip(_json(value))
    return _got(value)
