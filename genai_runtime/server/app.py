"""The Starlette app: OpenAI routes over a ``ServerEngine``, with auth, body limits and SSE
streaming.

Nothing here touches the model: requests are parsed (``protocol``), turned into token ids on a
worker thread (a chat template and a tokenizer over a 1 MiB prompt take a while, and /health
must not wait for them), and handed to the engine thread as ``Job``s; results come back as
events on an asyncio queue. Prompts and generated text are never logged: one access line per
request (``access_log``) says method, path, status, token counts, time and the names of ignored
fields; the messages of unexpected exceptions, which may quote a prompt, are not logged either.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..batching.settings import SettingError
from ..decoding.picker import TokenPicker
from ..errors import GenaiRuntimeError
from .access_log import AccessLog, note_ignored, note_usage
from .embeddings import embeddings_route
from .engine import Job, ServerEngine
from .heap import TrimAfterLargeRequests
from .protocol import (
    RESPONSE_FORMATS,
    APIError,
    ParsedRequest,
    bad,
    parse_chat,
    parse_completion,
    request_grammar,
)
from .reasoning import ThinkSplitter, template_variables, thinks
from .replies import ReplyShape
from .responses import ResponseStore, assistant_message, chat_body, events, response
from .think_gate import ThinkGate
from .tool_calls import CALL_FORMATS, CallSplitter, tag_tokens
from .tool_prompt import ToolTemplate, check_reaches, probe, template_input, uses_tools
from .tools import ToolRequest, ToolRequestError
from .transcriptions import DEFAULT_MAX_AUDIO_BYTES, transcription_route

log = logging.getLogger("genai_runtime.server")

DEFAULT_MAX_BODY = 1 << 20
DEFAULT_TIMEOUT = 600.0
DEFAULT_READ_TIMEOUT = 30.0  # for a request's headers, then for its body
ROUTES = (
    "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
    "/v1/responses", "/v1/embeddings",
)  # fmt: skip


@dataclass
class ServerState:
    """What the routes need; ``engine`` is None while the model loads."""

    served_name: str
    api_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    max_audio_bytes: int = DEFAULT_MAX_AUDIO_BYTES
    timeout: float = DEFAULT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    # False: special-token text typed in a message is plain text (it cannot forge a turn)
    special_tokens_in_messages: bool = False
    engine: ServerEngine | None = None
    load_error: str | None = None
    tool_template: ToolTemplate | None = None  # how the chat template takes tools, once asked
    created: int = 0
    responses: ResponseStore = field(default_factory=ResponseStore)  # previous_response_id
    # Chat templates, tokenizing and grammar compiles run here, off the event loop.
    workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(
            min(4, os.cpu_count() or 1), thread_name_prefix="genai-prompt"
        )
    )


def create_app(state: ServerState) -> Starlette:
    state.created = state.created or int(time.time())

    def authorize(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # compare_digest: the time taken does not depend on how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), state.api_key.encode()
        ):
            raise APIError(
                401,
                "invalid or missing API key (send Authorization: Bearer <key>)",
                type="authentication_error",
                code="invalid_api_key",
            )

    def engine() -> ServerEngine:
        if state.engine is None:
            why = state.load_error or "the model is still loading"
            raise APIError(503, why, type="server_error", code="model_not_ready")
        if not state.engine.alive:
            raise APIError(503, f"the engine failed: {state.engine.failed}", type="server_error")
        return state.engine

    async def health(request: Request) -> Response:
        if state.engine is None or not state.engine.alive:
            status = "error" if (state.load_error or state.engine) else "loading"
            return JSONResponse({"status": status}, status_code=503)
        active, waiting = state.engine.counts()
        return JSONResponse({"status": "ok", "active": active, "queued": waiting})

    async def models(request: Request) -> Response:
        authorize(request)
        cards = [_model_card(state, name) for name in _served_names(state)]
        return JSONResponse({"object": "list", "data": cards})

    async def model_info(request: Request) -> Response:
        authorize(request)
        name = request.path_params["name"]
        if name not in _served_names(state):
            raise _no_model(name, state)
        return JSONResponse(_model_card(state, name))

    async def metrics(request: Request) -> Response:
        authorize(request)
        return PlainTextResponse(_metrics(state), media_type="text/plain; version=0.0.4")

    async def chat(request: Request) -> Response:
        authorize(request)
        parsed = parse_chat(await _read_json(request, state))
        eng, adapter = _checked(state, parsed, engine())
        note_ignored(request.scope, parsed.unknown)
        literal = not state.special_tokens_in_messages
        ids, pickers, parsed = await _off_loop(state, _chat_prompt, state, eng, parsed, literal)
        return await _respond(
            request, state, eng, parsed, [ids], pickers, chat=True, adapter=adapter
        )

    async def completions(request: Request) -> Response:
        authorize(request)
        parsed = parse_completion(await _read_json(request, state))
        eng, adapter = _checked(state, parsed, engine())
        note_ignored(request.scope, parsed.unknown)
        prompts = [await _off_loop(state, _completion_prompt, eng, p) for p in parsed.prompts]
        pickers = [_picker(eng, parsed) for _ in range(len(prompts) * parsed.n)]
        return await _respond(
            request, state, eng, parsed, prompts, pickers, chat=False, adapter=adapter
        )

    async def responses(request: Request) -> Response:
        authorize(request)
        body = await _read_json(request, state)
        chat_request, messages, tools = chat_body(body, state.responses)
        parsed = parse_chat(chat_request)
        eng, adapter = _checked(state, parsed, engine())
        literal = not state.special_tokens_in_messages
        ids, pickers, parsed = await _off_loop(state, _chat_prompt, state, eng, parsed, literal)
        reply = await _respond(
            request, state, eng, parsed, [ids], pickers, chat=True, adapter=adapter
        )
        rid = "resp_" + uuid.uuid4().hex[:24]

        def keep(out: dict[str, Any]) -> None:
            state.responses.put(rid, [*messages, assistant_message(out)], tools)

        if isinstance(reply, StreamingResponse):
            return StreamingResponse(
                events(reply.body_iterator, rid, body, keep), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )  # fmt: skip
        if not isinstance(reply, JSONResponse):  # the client went away
            return reply
        out = response(json.loads(reply.body), rid, body)
        keep(out)
        return JSONResponse(out)

    async def api_error(request: Request, exc: APIError) -> Response:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        err = APIError(exc.status_code, str(exc.detail), type=kind)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model_info, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        transcription_route(state, authorize, engine),
        embeddings_route(state, authorize, engine, lambda request: _read_json(request, state)),
    ]
    return Starlette(
        routes=routes,
        # The access log outside: it records the 500 _Contained answers for a failed request.
        middleware=[
            Middleware(AccessLog),
            Middleware(TrimAfterLargeRequests),
            Middleware(_Contained),
        ],
        exception_handlers={APIError: api_error, HTTPException: http_error},
    )


class _Contained:
    """ASGI middleware: an unexpected exception becomes a 500 envelope and one log line with its
    type and where it was raised. Never its message or traceback text (they may quote the
    request), and it goes no further: Starlette's own error layer would log the traceback."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
            path = scope.get("path", "")
            path = path if path in ROUTES else "another path"
            log.error("unexpected %s at %s while serving %s", type(exc).__name__, where, path)
            if scope["type"] == "http" and not started:
                err = APIError(500, "internal server error", type="server_error")
                await JSONResponse(err.body(), status_code=500)(scope, receive, send)


def _served_names(state: ServerState) -> list[str]:
    """The base model's name, then ``name:adapter`` for each LoRA adapter loaded."""
    adapters = state.engine.adapters if state.engine is not None else None
    names = adapters.names() if adapters is not None else []
    return [state.served_name, *(f"{state.served_name}:{a}" for a in names)]


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    card = {"id": name, "object": "model", "created": state.created, "owned_by": "genai_runtime"}
    if name != state.served_name:
        card["parent"] = state.served_name  # a LoRA adapter over the base model
    return card


def _no_model(name: str, state: ServerState) -> APIError:
    shown = name if len(name) <= 64 else name[:61] + "..."
    served = ", ".join(repr(n) for n in _served_names(state)[:8])
    return APIError(
        404,
        f"the model {shown!r} is not served here (served: {served})",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def _checked(
    state: ServerState, parsed: ParsedRequest, eng: ServerEngine
) -> tuple[ServerEngine, str | None]:
    """The engine and the LoRA adapter the request's model names (``base:adapter``, None for
    the base). The model field is a served name, compared as a string: never opened as a path."""
    if parsed.model not in _served_names(state):
        raise _no_model(parsed.model, state)
    adapter = parsed.model[len(state.served_name) + 1 :] or None
    return eng, adapter


async def _off_loop(state: ServerState, fn: Callable, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(state.workers, fn, *args)


def _chat_prompt(
    state: ServerState, eng: ServerEngine, parsed: ParsedRequest, literal: bool
) -> tuple[np.ndarray, list[Any], ParsedRequest]:
    """(prompt ids, a token picker per choice, the request with the prompt text when replies
    may think) of a chat request; runs on a worker thread (a response_format or tool grammar
    compiles here)."""
    messages, tools, template, given = parsed.messages, None, None, None
    if parsed.tools is not None or uses_tools(messages):
        if state.tool_template is None:
            state.tool_template = probe(eng.tokenizer.apply_chat_template)
        template = state.tool_template
        given = template_input(messages, parsed.tools, template)
        messages, tools = given.messages, given.tools
    try:
        if given is not None and given.instructions is not None:
            check_reaches(eng.tokenizer.apply_chat_template(messages), given)
        source = eng.tokenizer.templates.pick(tools is not None)
        variables = template_variables(parsed.template_fields, source)
        ids = eng.tokenizer.encode_chat(
            messages, tools=tools, literal_content=literal, template_kwargs=variables
        )
        if thinks(source):
            text = eng.tokenizer.apply_chat_template(messages, tools=tools,
                                                     template_kwargs=variables)  # fmt: skip
            parsed = replace(parsed, think_prompt=text)
    except ToolRequestError as exc:
        raise bad(str(exc), exc.param) from None
    except GenaiRuntimeError as exc:  # e.g. the sandbox refused what a template tried
        param = "tools" if tools else "messages"
        raise bad(f"the chat template could not be applied: {exc}", param) from exc
    pickers = [_picker(eng, parsed, template, len(ids)) for _ in range(parsed.n)]
    return ids.astype(np.int64), pickers, parsed


def _completion_prompt(eng: ServerEngine, prompt: str | list[int]) -> np.ndarray:
    """Prompt ids of one completions prompt; runs on a worker thread."""
    if isinstance(prompt, list):
        ids = np.asarray(prompt, np.int64)
        vocab = eng.model.vocab_size or 0
        if ids.min() < 0 or ids.max() >= vocab:
            raise bad(f"prompt token ids must be in [0, {vocab})", "prompt")
        return ids
    try:  # the prompt is the client's own text: special-token text in it is meant
        ids = eng.tokenizer.encode_with_literals(prompt)
    except GenaiRuntimeError as exc:
        raise bad(f"the prompt could not be tokenized: {exc}", "prompt") from exc
    if ids.size == 0:
        raise bad("the prompt encodes to no tokens", "prompt")
    return ids.astype(np.int64)


async def _read_json(request: Request, state: ServerState) -> Any:
    limit = state.max_body
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise _too_big(limit)
    try:  # a client that stalls mid-body must not hold its connection for ever
        body = await asyncio.wait_for(_read_body(request, limit), state.read_timeout)
    except asyncio.TimeoutError:
        raise APIError(
            408, f"the request body did not arrive within {state.read_timeout:g} s",
            type="timeout_error", code="read_timeout", headers={"Connection": "close"},
        ) from None  # fmt: skip
    except ClientDisconnect:
        raise APIError(499, "the client went away") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise bad(f"the request body is not valid JSON: {str(exc)[:100]}") from exc


def _too_big(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _read_body(request: Request, limit: int) -> bytearray:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_big(limit)
    return body


def _picker(
    eng: ServerEngine, parsed: ParsedRequest, template: ToolTemplate | None = None,
    prompt_length: int = 0,
):  # fmt: skip
    """A token picker for one of the request's choices (each has its own: a grammar holds the
    state of one reply): its sampling and its grammar, if any: a call to the tools when
    tool_choice requires one (the reply is then a call, so response_format has no text to
    shape), else the response_format's. A reply that may think gets both through a
    ``ThinkGate``: the grammar starts after the thinking, which the budget bounds."""
    tools = parsed.tools
    if tools is not None and tools.constrained and template is not None:
        grammar = _tool_grammar(eng, tools, CALL_FORMATS[template.format])
    else:
        fmt = parsed.sampling.response_format
        grammar = None if fmt is None else RESPONSE_FORMATS[fmt["type"]](eng.model, fmt)
    if parsed.think_prompt is not None and (grammar is not None or parsed.think_budget is not None):
        grammar = ThinkGate(
            eng.tokenizer, parsed.think_prompt, prompt_length, budget=parsed.think_budget,
            grammar=grammar, eos=eng.model.spec.tokens.eos,
        )  # fmt: skip
    try:
        return eng.picker(parsed.sampling, grammar)
    except SettingError as exc:  # e.g. a logit_bias id past the vocabulary
        raise bad(str(exc), exc.param) from None


def _tool_grammar(eng: ServerEngine, tools: ToolRequest, fmt: Any) -> Any:
    tags = tag_tokens(eng.tokenizer.encode)
    try:
        return request_grammar(
            eng.model, "lark_grammar", fmt.grammar(tools.callable, tools.several, tags), "tools"
        )
    except APIError:  # name the tool whose parameters llguidance refused
        for i, tool in enumerate(tools.tools):
            if tool in tools.callable:
                where = f"tools[{i}].function.parameters"
                grammar = fmt.grammar([tool], False, tags)
                request_grammar(eng.model, "lark_grammar", grammar, where)
        raise


def _thinking(parsed: ParsedRequest) -> ThinkSplitter | None:
    return None if parsed.think_prompt is None else ThinkSplitter(parsed.think_prompt)


def _splitter(parsed: ParsedRequest) -> CallSplitter | None:
    """What finds the calls in a reply to ``parsed`` (None: calls are not allowed)."""
    tools = parsed.tools
    if tools is None or not tools.calls_allowed:
        return None
    return CallSplitter([t.name for t in tools.callable], tools.several)


async def _respond(
    request: Request,
    state: ServerState,
    eng: ServerEngine,
    parsed: ParsedRequest,
    prompts: list[np.ndarray],
    pickers: list[TokenPicker],
    *,
    chat: bool,
    adapter: str | None = None,
) -> Response:
    """Run each prompt ``parsed.n`` times (choice ``i * n + j`` is prompt i's j-th, its seed the
    request's plus j, so seeded choices differ) and answer with every choice."""
    s = parsed.sampling
    loop = asyncio.get_running_loop()
    jobs = []
    for i, ids in enumerate(prompts):
        room = eng.context - len(ids)
        max_tokens = s.max_tokens if s.max_tokens is not None else room
        if max_tokens > room or room < 1:
            raise APIError(
                400,
                f"the served context is {eng.context} tokens (serve --max-context sets it); "
                f"the prompt has {len(ids)} and max_tokens asks for {max_tokens} more",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        for j in range(parsed.n):
            sampling = s if not j or s.seed is None else replace(s, seed=s.seed + j)
            job = Job(
                prompt=ids, sampling=sampling, max_tokens=max_tokens,
                deadline=time.monotonic() + state.timeout, loop=loop, events=asyncio.Queue(),
                picker=pickers[i * parsed.n + j], adapter=adapter,
            )  # fmt: skip
            jobs.append(job)
    try:
        for job in jobs:
            eng.submit(job)
    except APIError:  # the queue filled up part-way: no choice of this request runs
        for job in jobs:
            eng.cancel(job)
        raise
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    log.debug("%s: %d choices, %d prompt tokens", rid, len(jobs), sum(len(p) for p in prompts))
    created = int(time.time())
    shapes = [
        ReplyShape(rid, parsed.model, created, chat, eng, _splitter(parsed), _thinking(parsed), k)
        for k in range(len(jobs))
    ]
    if parsed.stream:
        return StreamingResponse(
            _sse(request, eng, jobs, shapes, parsed, len(prompts)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    watcher = asyncio.create_task(_watch_disconnect(request, eng, jobs))
    try:
        answers = []
        for job in jobs:
            answer = await _answer(job)
            if answer is None:  # the client went away: the finally cancels every choice
                return Response(status_code=499)
            answers.append(answer)
        bodies = [shape.final(*a) for shape, a in zip(shapes, answers)]
        out = bodies[0]
        out["choices"] = [b["choices"][0] for b in bodies]
        out["usage"] = _usage([a[3] for a in answers], parsed.n, len(prompts))
        note_usage(request.scope, out["usage"])
        return JSONResponse(out)
    finally:
        watcher.cancel()
        for job in jobs:
            eng.cancel(job)  # no-op once done; frees the slot if we leave early


async def _answer(job: Job) -> tuple[str, list, str, dict] | None:
    """(text, logprob entries, finish_reason, usage) of one finished job; None if the client
    went away."""
    text, entries = [], []
    while True:
        event = await job.events.get()
        if event[0] == "delta":
            text.append(event[1])
            entries.extend(event[2])
        elif event[0] == "error":
            raise event[1]
        elif event[0] == "gone":
            return None
        else:
            return "".join(text), entries, event[1], event[2]


def _usage(usages: list[dict[str, Any]], n: int, prompts: int) -> dict[str, Any]:
    """The request's usage from its choices' (choice ``i * n + j`` is prompt i's j-th: each
    prompt counts once)."""
    prompt_tokens = sum(usages[i * n]["prompt_tokens"] for i in range(prompts))
    completion = sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    details = [u["completion_tokens_details"] for u in usages if "completion_tokens_details" in u]
    if details:  # speculation's drafts, kept and thrown away
        out["completion_tokens_details"] = {k: sum(d[k] for d in details) for k in details[0]}
    return out


async def _watch_disconnect(request: Request, eng: ServerEngine, jobs: list[Job]) -> None:
    """Cancel every job when the client goes away (the body is read, so ``receive`` now only
    reports the disconnect); the first job's events say so."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for job in jobs:
                eng.cancel(job)
            jobs[0].events.put_nowait(("gone",))
            return


async def _sse(
    request: Request, eng: ServerEngine, jobs: list[Job], shapes: list[ReplyShape],
    parsed: ParsedRequest, prompts: int,
) -> AsyncIterator[str]:  # fmt: skip
    """The stream of every choice: chunks of each as its tokens come, by ``index``, then one
    usage chunk for them all when asked for."""
    usage = parsed.include_usage
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(k: int, job: Job) -> None:
        while True:
            event = await job.events.get()
            merged.put_nowait((k, event))
            if event[0] != "delta":
                return

    tasks = [asyncio.create_task(forward(k, job)) for k, job in enumerate(jobs)]
    tasks.append(asyncio.create_task(_watch_disconnect(request, eng, jobs)))
    try:
        for shape in shapes:
            yield _frame(shape.chunk(role=True, usage=usage))
        usages: dict[int, dict[str, Any]] = {}
        while len(usages) < len(jobs):
            k, event = await merged.get()
            if event[0] == "delta":
                for chunk in shapes[k].deltas(event[1], event[2], usage):
                    yield _frame(chunk)
            elif event[0] == "error":
                yield _frame(event[1].body())
                break
            elif event[0] == "gone":
                return
            else:
                usages[k] = event[2]
                for chunk in shapes[k].closing(event[1], usage):
                    yield _frame(chunk)
        if len(usages) == len(jobs):
            total = _usage([usages[k] for k in range(len(jobs))], parsed.n, prompts)
            note_usage(request.scope, total)
            if usage:
                yield _frame(shapes[0].usage_chunk(total))
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for job in jobs:
            eng.cancel(job)


def _frame(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _metrics(state: ServerState) -> str:
    lines = []

    def metric(name: str, kind: str, value: float, labels: str = "") -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value}")

    eng = state.engine
    metric("genai_up", "gauge", 1 if eng is not None and eng.alive else 0)
    if eng is not None:
        active, waiting = eng.counts()
        stats = eng.stats
        metric("genai_active_requests", "gauge", active)
        metric("genai_queued_requests", "gauge", waiting)
        for outcome, count in sorted(stats.requests.items()):
            metric("genai_requests_total", "counter", count, f'{{outcome="{outcome}"}}')
        metric("genai_prompt_tokens_total", "counter", stats.prompt_tokens)
        metric("genai_prompt_tokens_reused_total", "counter", stats.reused_tokens)
        metric("genai_completion_tokens_total", "counter", stats.completion_tokens)
        metric("genai_decode_steps_total", "counter", stats.steps)
        metric("genai_time_to_first_token_seconds_sum", "counter", round(stats.ttft_sum, 6))
        metric("genai_time_to_first_token_seconds_count", "counter", stats.ttft_count)
        for name, kind, value in [*eng.prompt_cache_metrics(), *eng.speculation_metrics()]:
            metric(name, kind, value)
    return "\n".join(lines) + "\n"
