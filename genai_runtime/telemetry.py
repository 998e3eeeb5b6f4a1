"""onnxruntime's telemetry, off unless the user opts in.

onnxruntime (1.29 and later) writes a device id and a queue of telemetry events under
``~/.cache/Microsoft/DeveloperTools/.onnxruntime`` in every process, and
``disable_telemetry_events()`` does not stop that: only ``ORT_DISABLE_TELEMETRY=1`` in the
environment before onnxruntime is first imported does. The package's first import sets it;
``GENAI_RUNTIME_TELEMETRY=1`` leaves onnxruntime's own default. A program that imports onnxruntime
before genai_runtime decides for itself.
"""

from __future__ import annotations

import os

OPT_IN = "GENAI_RUNTIME_TELEMETRY"

if os.environ.get(OPT_IN) != "1":
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
