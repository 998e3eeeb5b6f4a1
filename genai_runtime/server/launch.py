"""Starting the server: the engine over a loaded model, the limits checked, the socket bound
before the model loads, and ``serve``'s exit when the model cannot load."""

from __future__ import annotations

import errno
import ipaddress
import logging
import math
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..batching.prompt_cache import DEFAULT_MEMORY_MB
from ..batching.prompt_files import DEFAULT_DISK_MB
from ..batching.speculation import MAX_DRAFTS
from ..config.pulled import pulled_folder
from ..errors import GenaiRuntimeError
from ..runtime.sessions import STOP_SPINNING
from .access_log import configure_logging, remove_logging

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("genai_runtime.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_adapter_names(adapters: Mapping[str, str] | None) -> None:
    """A request names an adapter as ``<served name>:<adapter>``, so a name holds no ':'."""
    for name in adapters or {}:
        if not isinstance(name, str) or not name or ":" in name:
            raise GenaiRuntimeError(f"adapter name {name!r}: expected a name without ':'")


def engine_over(model, adapters: Mapping[str, str] | None = None, **engine_options):
    """Load LoRA ``adapters`` (name -> ``.onnx_adapter`` path) onto a loaded ``model`` and
    start an engine over it."""
    from ..adapters import Adapters
    from ..tokenizer import Tokenizer
    from .engine import ServerEngine

    check_adapter_names(adapters)
    loaded = None
    if adapters:
        loaded = Adapters(model)
        for name, path in adapters.items():
            loaded.load(path, name)
    engine = ServerEngine(model, Tokenizer(model), adapters=loaded, **engine_options)
    engine.start()
    return engine


def _load(model_dir: str | Path, device: str | None, threads: int | None, spin: bool):
    """A model folder checked against its recorded hashes (when an import wrote them) and
    loaded on ``device`` and ``threads``; ``spin=False`` stops its threads spinning after each
    run (sessions that take turns)."""
    from ..folder_hashes import verify_folder
    from ..model import Config, Model

    if Path(model_dir).is_dir():
        for note in verify_folder(model_dir, lenient=True):
            log.warning("%s", note)
    config = Config(str(model_dir))
    if device:
        config.use_device(device)
    if threads is not None:
        config.set_threads(threads)
    if not spin:
        config.set_session_config_entry(STOP_SPINNING, "1")
    return Model(config)


def build_engine(
    model_dir: str | Path,
    device: str | None = None,
    adapters: Mapping[str, str] | None = None,
    threads: int | None = None,
    **engine_options,
):
    """Load a model folder (and its LoRA ``adapters``, and a ``draft_model`` folder) and start
    an engine over it, its sessions on ``threads`` intra-op threads each when given (``serve
    --threads``). A folder an import wrote is checked against its recorded hashes first, as
    ``run`` checks it."""
    speculate = bool(engine_options.get("speculate"))  # the decoder and verify take turns
    model = _load(model_dir, device, threads, spin=not speculate)
    draft_dir = engine_options.pop("draft_model", None)
    if draft_dir is not None:
        try:
            engine_options["draft"] = _load(draft_dir, device, threads, spin=False)
        except GenaiRuntimeError as exc:
            raise GenaiRuntimeError(f"draft model {draft_dir}: {exc}") from exc
    return engine_over(model, adapters, **engine_options)


def serve(model_dir: str, *, log_level: str = "info", **options) -> None:
    """Serve until interrupted (``genai-runtime serve``); options as for ``ServerHandle``.
    Log records (one access line per request at ``info``) go to stderr."""
    handler = configure_logging(log_level)
    try:
        handle = ServerHandle(model_dir, log_level=log_level, **options)
        print(f"loading {handle.state.served_name!r} ...", file=sys.stderr, flush=True)
        threading.Thread(target=handle.announce_or_stop, name="genai-load-watch",
                         daemon=True).start()  # fmt: skip
        try:
            handle.server.run(sockets=[handle.sock])
        finally:
            handle.close_engine()
        handle.raise_load_failure()
    finally:  # in-process callers (tests) keep no handler on a stream that may close
        remove_logging(handler)


class ServerHandle:
    """A bound socket, the app state (the model loads in the background) and a uvicorn server.

    ``serve`` runs it in the foreground; ``start()`` runs it on a thread (tests, benchmarks)
    and returns once the server accepts connections and the model is loaded.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        insecure: bool = False,
        log_level: str = "warning",
        threads: int | None = None,
        **options: Any,
    ):
        """``options``: ``ServeOptions``' fields; ``threads``: the sessions' intra-op threads
        (default: the config's, else onnxruntime's own)."""
        try:
            import uvicorn
        except ImportError as exc:
            raise GenaiRuntimeError(
                'the server needs the "server" extra: pip install "genai_runtime[server]"'
            ) from exc
        from .app import create_app
        from .connections import with_head_timeout

        opts = ServeOptions(**options)
        if not is_loopback(host) and not opts.api_key:
            if not insecure:
                raise GenaiRuntimeError(
                    f"refusing to serve on non-loopback host {host!r} without an API key; pass "
                    "--api-key KEY (or --insecure to accept anyone on the network)"
                )
            log.warning("serving on %s without an API key: anyone who reaches it can use it", host)
        folder = pulled_folder(model_dir) or Path(model_dir)
        if not folder.is_dir():
            raise GenaiRuntimeError(f"model folder not found: {model_dir} (nor a pulled model)")
        model_dir = str(folder)
        self.state = opts.state(folder.resolve().name)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise GenaiRuntimeError(
                f"cannot listen on {host}:{port}: {why} (--port N picks another, --port 0 any "
                "free one)"
            ) from None
        # Listen now, so the URL printed before uvicorn starts already takes connections (the
        # kernel queues them); uvicorn listens on the same socket again.
        self.sock.listen(2048)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.sock.getsockname()[1]}"
        self.loaded = threading.Event()
        self.load_failure: Exception | None = None
        threading.Thread(
            target=self._load, args=(model_dir, {**opts.engine_options(), "threads": threads}),
            name="genai-load", daemon=True,
        ).start()  # fmt: skip
        config = uvicorn.Config(
            create_app(self.state),
            log_level=log_level,
            access_log=False,
            http=with_head_timeout(self.state.read_timeout),
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def _load(self, model_dir: str, engine_options: dict) -> None:
        try:
            self.state.engine = build_engine(model_dir, **engine_options)
            engine = self.state.engine
            log.info("model loaded (%s decode; prompt cache: %s; speculation: %s)",
                     engine.slots.kind, engine.prompt_cache_note,
                     engine.core.speculation_note)  # fmt: skip
        except Exception as exc:
            self.load_failure = exc
            self.state.load_error = f"the model could not be loaded: {exc}"
            log.error("%s", self.state.load_error)
        self.loaded.set()

    def announce_or_stop(self) -> None:
        """Once the load ends: say where the server serves (stdout), or stop it if the load
        failed (``serve`` then raises the error). Nothing says "serving" before the model is
        loaded and checked."""
        self.loaded.wait()
        if self.load_failure is not None:
            self.server.should_exit = True
            return
        engine = self.state.engine
        print(
            f"serving {self.state.served_name!r} on {self.url}/v1 (context {engine.context} "
            f"tokens: {engine.context_source})",
            flush=True,
        )

    def raise_load_failure(self) -> None:
        """The load's error, if it failed, as a ``GenaiRuntimeError``."""
        failure = self.load_failure
        if isinstance(failure, GenaiRuntimeError):
            raise failure
        if failure is not None:
            raise GenaiRuntimeError(self.state.load_error) from failure

    def start(self, timeout: float = 120.0, wait_for_model: bool = True) -> ServerHandle:
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        if not wait_for_model:
            return self
        self.loaded.wait(max(0.0, deadline - time.monotonic()))
        if not self.server.started or self.state.engine is None:
            self.stop()
            raise GenaiRuntimeError(self.state.load_error or "the server did not start in time")
        return self

    def close_engine(self) -> None:
        self.loaded.wait(60)
        if self.state.engine is not None:
            self.state.engine.stop()
        self.state.workers.shutdown(wait=False)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.close_engine()


@dataclass(frozen=True)
class ServeOptions:
    """What a server is asked for besides its model and address: ``serve``, ``ServerHandle``
    and a Ray replica take the same options, checked when made. ``adapters``: LoRA adapter
    name -> ``.onnx_adapter`` file; a request picks one with ``model: "<served name>:<name>"``.
    """

    served_name: str | None = None
    api_key: str | None = None
    max_queued: int = 16
    max_active: int = 4
    max_context: int | None = None
    max_body: int | None = None
    timeout: float | None = None
    read_timeout: float | None = None
    batched: bool | None = None
    prefix_reuse: bool = True
    special_tokens_in_messages: bool = False
    device: str | None = None
    adapters: Mapping[str, str] | None = None
    prompt_cache_mb: int = DEFAULT_MEMORY_MB  # 0: no prompt cache
    prompt_cache_dir: str | None = None
    prompt_cache_disk_mb: int = DEFAULT_DISK_MB
    speculate: int = 0  # prompt-lookup drafts per request per pass (0: none)
    draft_model: str | None = None  # a folder whose greedy tokens are the drafts instead

    def __post_init__(self) -> None:
        speculate = self.speculate
        if isinstance(speculate, bool) or not isinstance(speculate, int) or not (
                0 <= speculate <= MAX_DRAFTS):  # fmt: skip
            raise GenaiRuntimeError(
                f"speculate must be an integer from 0 to {MAX_DRAFTS}, got {speculate!r}"
            )
        if self.draft_model is not None and not speculate:
            raise GenaiRuntimeError("a draft model needs speculate: the most drafts per pass")
        check_limits(
            max_queued=self.max_queued, max_active=self.max_active, max_context=self.max_context,
            max_body=self.max_body, timeout=self.timeout, read_timeout=self.read_timeout,
            prompt_cache_disk_mb=self.prompt_cache_disk_mb,
            prompt_cache_mb=self.prompt_cache_mb or None,  # 0 is allowed: no prompt cache
        )  # fmt: skip
        check_adapter_names(self.adapters)

    def engine_options(self) -> dict[str, Any]:
        """``build_engine``'s keywords."""
        return dict(
            max_queued=self.max_queued,
            max_active=self.max_active,
            max_context=self.max_context,  # None: the model's own, as memory allows
            batched=self.batched,
            prefix_reuse=self.prefix_reuse,
            device=self.device,
            adapters=dict(self.adapters or {}),
            prompt_cache_mb=self.prompt_cache_mb,
            prompt_cache_dir=self.prompt_cache_dir,
            prompt_cache_disk_mb=self.prompt_cache_disk_mb,
            speculate=self.speculate,
            draft_model=self.draft_model,
        )

    def state(self, folder_name: str, **more: Any) -> ServerState:
        """What the app serves from (``more``: further ``ServerState`` fields, such as the
        engine), with the defaults for what is not given."""
        from .app import DEFAULT_MAX_BODY, DEFAULT_READ_TIMEOUT, DEFAULT_TIMEOUT, ServerState

        return ServerState(
            served_name=self.served_name or folder_name,
            api_key=self.api_key or None,
            max_body=self.max_body or DEFAULT_MAX_BODY,
            timeout=self.timeout or DEFAULT_TIMEOUT,
            read_timeout=self.read_timeout or DEFAULT_READ_TIMEOUT,
            special_tokens_in_messages=self.special_tokens_in_messages,
            **more,
        )


def check_limits(**limits: float | None) -> None:
    """Counts and timeouts must be positive (None: the default). ``max_queued=0`` would answer
    every request 429 and ``timeout=-1`` every request 408."""
    for name, value in limits.items():
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise GenaiRuntimeError(f"{name} must be a positive number, got {value!r}")
        if (name.startswith("max_") or name.endswith("_mb")) and not isinstance(value, int):
            raise GenaiRuntimeError(f"{name} must be a positive integer, got {value!r}")
