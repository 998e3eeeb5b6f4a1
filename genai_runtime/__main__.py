"""``python -m genai_runtime``: the ``genai-runtime`` command line."""

from .cli import main

raise SystemExit(main())
