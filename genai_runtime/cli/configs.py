"""``validate``, ``explain`` and ``migrate``: what a config says and whether its graphs agree."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..config import load, migrate_document
from ..config.loader import find_config_file
from ..errors import GenaiRuntimeError
from ..explain import explain_spec, format_report
from ..routing import classify
from ..runtime.graph_check import check_graphs
from ..tokenizer import folder_problems
from .common import add_config_args, model_path


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a config (and its ONNX graphs) for every problem")
    add_config_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("explain", help="show the route, flow, stages and KV cache of a config")
    add_config_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("migrate", help="write the v2 form of a config (v1 or v2)")
    p.add_argument("path", metavar="PATH", help="model folder, config file or pulled name")
    p.add_argument("-o", "--output", metavar="OUT", help="output file (default: stdout)")
    p.add_argument("--force", action="store_true", help="allow -o to overwrite an existing file")
    p.set_defaults(func=cmd_migrate)


def cmd_validate(args: argparse.Namespace) -> int:
    args.path = model_path(args.path)
    spec = load(args.path, preset_dirs=args.presets, root=args.root)
    route = classify(spec)
    kv_plan = None
    if not args.config_only:
        check = check_graphs(spec)
        for warning in check.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        errors = check.errors + folder_problems(spec.model_dir, spec.tokens, spec.root)
        if errors:
            for error in errors:
                print(f"error: {error}", file=sys.stderr)
            return 1
        if check.pipeline is not None and check.plan.layout is not None:
            try:
                kv_plan = check.pipeline.kv_plan()
            except GenaiRuntimeError:  # already reported as a warning
                kv_plan = None
    print(f"ok: {args.path} (v{spec.source_version}, route {route.kind})")
    if kv_plan is not None:  # the route's reasons and more: explain
        print(f"kv cache: {kv_plan.kind} ({kv_plan.reason})")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    args.path = model_path(args.path)
    spec = load(args.path, preset_dirs=args.presets, root=args.root)
    pipeline, note = None, "--config-only"
    if not args.config_only:
        check = check_graphs(spec)
        pipeline = check.pipeline
        note = "; ".join(check.errors) or None
    report = explain_spec(
        spec,
        pipeline=pipeline,
        source=str(find_config_file(args.path, spec.root)),
        version=spec.source_version,
        graph_note=note,
    )
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        sys.stdout.write(format_report(report))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    args.path = model_path(args.path)
    source = find_config_file(args.path)
    text = json.dumps(migrate_document(args.path), indent=2, ensure_ascii=False) + "\n"
    if args.output and Path(args.output).exists() and not args.force:
        same = Path(args.output).resolve() == source.resolve()
        what = "is the source config" if same else "exists"
        raise GenaiRuntimeError(f"{args.output} {what}: pass --force to overwrite it")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
