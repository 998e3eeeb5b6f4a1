"""Session primitives both the KV caches and the executor build on: a graph's declared I/O
(``graph_io``), attributes scanned from an ONNX file (``onnx_scan``), a session bound by
IOBinding (``bound``) and the attention-mask / position state of a batch (``positions``)."""
