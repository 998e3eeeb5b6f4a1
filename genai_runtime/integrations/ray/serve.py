"""A Ray Serve deployment of the OpenAI-compatible server: one model and one engine per replica.

``OpenAIServer`` is the replica: it loads the model, starts the server's engine thread, and
hands Serve the same Starlette app ``genai-runtime serve`` runs (``serve.ingress`` with the app
built on the replica), so routes, auth, limits, streaming and errors are the server's own.
Serve's proxy spreads requests over the replicas and restarts a replica whose actor dies or
whose ``check_health`` fails (the engine thread stopped).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ...errors import GenaiRuntimeError
from ..loading import start_engine

APP_NAME = "genai-runtime"


def require_ray(module: str = "ray"):
    """Import a Ray module, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise GenaiRuntimeError(
            f'this needs Ray ({exc.name} is missing): pip install "genai_runtime[ray]"'
        ) from exc


class OpenAIServer:
    """One Serve replica of the server (options as for ``genai-runtime serve``; ``threads``:
    onnxruntime threads of this replica's sessions). The engine thread is a daemon that ends
    with the replica's process; nothing stops it before (the app may outlive this object). The
    HTTP connections are Serve's proxy's: the server's slow-header guard is not in front."""

    def __init__(
        self, model_dir: str, *, threads: int | None = None, created: int = 0, **options: Any
    ):
        from ...server import ServeOptions

        # The server's own options and checks: a replica refuses what `genai-runtime serve` does.
        opts = ServeOptions(**options)
        engine = start_engine(model_dir, threads=threads, **opts.engine_options())
        self.state = opts.state(Path(model_dir).resolve().name, engine=engine, created=created)

    def __serve_build_asgi_app__(self):
        """Serve calls this on the replica once ``__init__`` has run."""
        from ...server.app import create_app

        return create_app(self.state)

    def check_health(self) -> None:
        """Serve's periodic probe: a replica whose engine thread stopped is replaced."""
        engine = self.state.engine
        if engine is None or not engine.alive:
            raise GenaiRuntimeError(f"the engine is not running: {engine and engine.failed}")


def build_deployment(
    model_dir: str | Path,
    *,
    num_replicas: int | str = 1,
    autoscaling_config: dict[str, Any] | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    threads: int = 1,
    name: str = "OpenAIServer",
    deployment_options: dict[str, Any] | None = None,
    **server_options: Any,
):
    """A Serve application (``serve.run`` it) of ``num_replicas`` replicas, or of
    ``autoscaling_config``'s when given. Each replica reserves ``threads`` CPUs
    (``ray_actor_options`` overrides) and runs its sessions on that many threads.
    ``server_options`` are ``OpenAIServer``'s; ``deployment_options`` go to
    ``serve.deployment`` as they are. Builds the objects only: nothing starts Ray."""
    serve = require_ray("ray.serve")
    from ...server import ServeOptions

    # One creation time for every replica, so /v1/models answers the same from each.
    created = server_options.pop("created", int(time.time()))
    try:  # a misspelt option fails here, not on every replica
        checked = ServeOptions(**server_options)
    except TypeError as exc:
        raise GenaiRuntimeError(f"build_deployment: {exc}") from None
    options: dict[str, Any] = dict(deployment_options or {})
    options["ray_actor_options"] = {"num_cpus": threads, **(ray_actor_options or {})}
    if autoscaling_config is not None:
        options["autoscaling_config"] = autoscaling_config
    else:
        options["num_replicas"] = num_replicas
    # Serve sends a replica at most what its engine admits: the active rows plus the queue.
    admitted = checked.max_active + checked.max_queued
    options.setdefault("max_ongoing_requests", admitted)
    replica = serve.deployment(serve.ingress()(OpenAIServer), name=name, **options)
    return replica.bind(str(model_dir), threads=threads, created=created, **server_options)


def deploy(app, *, host: str = "127.0.0.1", port: int = 8000, name: str = APP_NAME) -> str:
    """Start Serve's HTTP proxy on ``host:port`` (Ray must be initialized) and run ``app``
    there; returns the base URL once every replica is up (``serve.run`` waits for that)."""
    serve = require_ray("ray.serve")
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(app, name=name, route_prefix="/")
    except RuntimeError as exc:  # Serve gave up: a replica's constructor kept failing
        raise GenaiRuntimeError(
            f"Ray Serve could not start the replicas: {_deploy_failure(serve, name) or exc}"
        ) from exc
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _deploy_failure(serve: Any, name: str) -> str | None:
    """The last line of the error a failed deployment reported (a replica's exception)."""
    try:
        deployments = serve.status().applications[name].deployments
    except Exception:  # the status itself is unavailable: the caller says what Serve raised
        return None
    for status in deployments.values():
        lines = [line for line in str(status.message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()
    return None


def serve_until_interrupted(
    model_dir: str,
    *,
    replicas: int = 1,
    threads: int = 1,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    insecure: bool = False,
    **server_options: Any,
) -> None:
    """``genai-runtime serve --ray``: join the cluster ``RAY_ADDRESS`` names, or start a local
    Ray instance on 127.0.0.1; deploy; serve until Ctrl-C or SIGTERM; then remove what it
    started."""
    import os
    import signal

    from ...server import is_loopback

    if not is_loopback(host) and not api_key and not insecure:
        raise GenaiRuntimeError(
            f"refusing to serve on non-loopback host {host!r} without an API key; pass "
            "--api-key KEY (or --insecure to accept anyone on the network)"
        )
    if not Path(model_dir).is_dir():  # replicas would fail one after another, later
        raise GenaiRuntimeError(f"model folder not found: {model_dir}")
    ray = require_ray()
    serve = require_ray("ray.serve")
    app = build_deployment(
        model_dir, num_replicas=replicas, threads=threads, api_key=api_key, **server_options
    )
    joined = bool(os.environ.get("RAY_ADDRESS"))
    if joined:
        ray.init()
    else:  # a private single-machine instance whose ports listen on loopback only
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        url = deploy(app, host=host, port=port)
        name = server_options.get("served_name") or Path(model_dir).resolve().name
        shape = f"Ray Serve replicas: {replicas}, threads per replica: {threads}"
        print(f"serving {name!r} on {url}/v1 ({shape})", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if joined:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
