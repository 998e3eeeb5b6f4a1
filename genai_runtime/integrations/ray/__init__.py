"""Ray adapters (the ``ray`` extra): a Serve deployment of the OpenAI-compatible server and a
Ray Data predictor. Importing this package does not import Ray; building a deployment imports
``ray.serve`` but starts nothing.
"""

from .data import BatchPredictor, generate_dataset
from .serve import OpenAIServer, build_deployment, deploy, serve_until_interrupted

__all__ = [
    "BatchPredictor",
    "OpenAIServer",
    "build_deployment",
    "deploy",
    "generate_dataset",
    "serve_until_interrupted",
]
