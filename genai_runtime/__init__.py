"""genai_runtime: a config-driven inference runtime for ONNX generative models.

The public API is call-compatible with onnxruntime-genai's Python API::

    import genai_runtime as og
    model = og.Model("path/to/model")
    tokenizer = og.Tokenizer(model)
"""

from . import telemetry  # noqa: F401  (first: it must run before onnxruntime is imported)
from .adapters import Adapters
from .batching import (
    Engine,
    EngineCapabilities,
    EngineErrorCode,
    EngineEvent,
    EngineEventBuffer,
    EngineEventFlags,
    FinishReason,
    Request,
    RequestOptions,
    TurnOptions,
    TurnUsage,
)
from .environment import (
    disable_telemetry_events,
    enable_telemetry_events,
    get_current_gpu_device_id,
    is_cuda_available,
    is_dml_available,
    is_openvino_available,
    is_qnn_available,
    is_rocm_available,
    is_webgpu_available,
    register_execution_provider_library,
    set_current_gpu_device_id,
    set_log_callback,
    set_log_options,
    unregister_execution_provider_library,
)
from .errors import (
    ConfigError,
    GenaiRuntimeError,
    GenerationError,
    ModelError,
    PathEscapeError,
    TokenizerError,
    TrustError,
    UnsupportedError,
)
from .generator import Generator, GeneratorParams
from .model import Config, Model
from .multimodal import (
    Audios,
    Images,
    MultiModalProcessor,
    NamedTensors,
    StreamingProcessor,
    Tensor,
)
from .tokenizer import Tokenizer, TokenizerStream

__version__ = "0.1.0"

__all__ = [
    "Adapters",
    "Audios",
    "Config",
    "ConfigError",
    "Engine",
    "EngineCapabilities",
    "EngineErrorCode",
    "EngineEvent",
    "EngineEventBuffer",
    "EngineEventFlags",
    "FinishReason",
    "GenaiRuntimeError",
    "GenerationError",
    "Generator",
    "GeneratorParams",
    "Images",
    "Model",
    "ModelError",
    "MultiModalProcessor",
    "NamedTensors",
    "PathEscapeError",
    "Request",
    "RequestOptions",
    "StreamingProcessor",
    "Tensor",
    "Tokenizer",
    "TokenizerError",
    "TokenizerStream",
    "TrustError",
    "TurnOptions",
    "TurnUsage",
    "UnsupportedError",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_current_gpu_device_id",
    "is_cuda_available",
    "is_dml_available",
    "is_openvino_available",
    "is_qnn_available",
    "is_rocm_available",
    "is_webgpu_available",
    "register_execution_provider_library",
    "set_current_gpu_device_id",
    "set_log_callback",
    "set_log_options",
    "unregister_execution_provider_library",
]
