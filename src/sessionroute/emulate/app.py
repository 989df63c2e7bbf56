"""The aiohttp application of one emulated vLLM server (OpenAI endpoints and vLLM extras).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming and not),
``GET /v1/models``, ``GET /health``, ``GET /ping``, ``GET /version``, ``GET /metrics``,
``POST /reset_prefix_cache``, ``POST /tokenize``, and with ``fault_routes`` only
``POST /fault/slowdown``. Errors are vLLM's JSON shape
(:func:`~sessionroute.emulate.protocol.error_body`), mapped in one middleware.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST

from sessionroute.emulate.driver import Ticket
from sessionroute.emulate.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmulatorRequestError,
    StreamOptions,
    TokenizeRequest,
    error_body,
    message_text,
    parse_body,
)
from sessionroute.emulate.service import EmulatedReplica, Generation
from sessionroute.emulate.sse import DONE, ChunkEncoder, sse
from sessionroute.emulate.tokenizer import render_chat
from sessionroute.replica import EngineRequestError, RequestResult

__all__ = ["EMULATOR_KEY", "build_app"]

log = logging.getLogger("sessionroute.emulate")

EMULATOR_KEY = web.AppKey("emulator", EmulatedReplica)
"""Application key of the :class:`EmulatedReplica` behind an app."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MAX_BODY = 256 * 1024 * 1024


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=_dumps(obj), content_type="application/json")


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return _json_response(error_body(status, message, param), status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EmulatorRequestError as exc:
        return _error(exc.status, str(exc), exc.param)
    except EngineRequestError as exc:
        return _error(400, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.reason)
    except Exception:
        log.exception("emulator request failed: %s %s", request.method, request.path)
        return _error(500, "internal emulator error")


def _emu(request: web.Request) -> EmulatedReplica:
    return request.app[EMULATOR_KEY]


async def _body(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except (RequestPayloadError, ContentEncodingError) as exc:  # not the encoding it claims
        raise EmulatorRequestError(400, f"Undecodable request body: {exc}") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EmulatorRequestError(400, f"Malformed JSON body: {exc}") from None


def _usage(res: RequestResult, completion_tokens: int | None = None) -> dict[str, Any]:
    c = res.output_tokens if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": res.prompt_tokens,
        "total_tokens": res.prompt_tokens + c,
        "completion_tokens": c,
        "prompt_tokens_details": {"cached_tokens": res.cached_tokens},
    }


# ---------------------------------------------------------------------- generation


async def _generate(
    request: web.Request,
    emu: EmulatedReplica,
    gen: Generation,
    *,
    chat: bool,
    stream: bool,
    options: StreamOptions | None,
) -> web.StreamResponse:
    ticket = emu.driver.submit(gen.engine_request, stream=stream)
    try:
        if stream:
            return await _stream(request, emu, gen, ticket, chat=chat, options=options)
        res = await ticket.wait()
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": gen.text, "tool_calls": []}
        else:
            choice["text"] = gen.text
        choice["stop_reason"] = None
        body = {
            "id": gen.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": emu.model,
            "choices": [choice],
            "usage": _usage(res),
        }
        resp = _json_response(body)
        resp.headers["x-request-id"] = gen.request_id
        return resp
    finally:
        if not ticket.done:
            emu.driver.abort(gen.request_id)


async def _stream(
    request: web.Request,
    emu: EmulatedReplica,
    gen: Generation,
    ticket: Ticket,
    *,
    chat: bool,
    options: StreamOptions | None,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": gen.request_id,
        }
    )
    await resp.prepare(request)
    enc = ChunkEncoder(
        gen.request_id,
        emu.model,
        int(time.time()),
        chat=chat,
        prompt_len=len(gen.prompt_ids),
        continuous=options is not None and bool(options.continuous_usage_stats),
    )
    include_usage = options is not None and bool(options.include_usage)
    pieces = gen.pieces
    out = len(pieces)
    if chat:
        await resp.write(enc.role())
    sent = 0
    try:
        while True:
            await ticket.changed()
            upto = out if ticket.result is not None else min(ticket.produced, out - 1)
            if upto > sent:
                await resp.write(
                    b"".join(enc.token(pieces[i], i, i == out - 1) for i in range(sent, upto))
                )
                sent = upto
            if ticket.result is not None:
                break
    except EmulatorRequestError as exc:
        await resp.write(sse(error_body(exc.status, str(exc))))
    else:
        if include_usage and ticket.result is not None:
            await resp.write(enc.usage(_usage(ticket.result)))
    await resp.write(DONE)
    await resp.write_eof()
    return resp


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    emu = _emu(request)
    req = parse_body(ChatCompletionRequest, await _body(request))
    emu.check_model(req.model)
    prompt_ids = emu.chat.encode(
        [(m.role, message_text(m)) for m in req.messages],
        add_generation_prompt=req.add_generation_prompt,
    )
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else None
    if max_tokens is None:
        max_tokens = req.max_tokens
    gen = emu.prepare(
        prompt_ids,
        max_tokens=max_tokens,
        kind="chat",
        temperature=req.temperature,
        seed=req.seed,
        cache_salt=req.cache_salt,
        n=req.n,
    )
    return await _generate(
        request, emu, gen, chat=True, stream=bool(req.stream), options=req.stream_options
    )


def _prompt_ids(
    emu: EmulatedReplica, prompt: str | list[int] | list[str] | list[list[int]]
) -> list[int]:
    if isinstance(prompt, str):
        return emu.tokenizer.encode(prompt)
    if not prompt:
        raise EmulatorRequestError(400, "The decoder prompt cannot be empty", "prompt")
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return emu.tokenizer.encode(prompt[0])
    if len(prompt) == 1 and isinstance(prompt[0], list):
        return list(prompt[0])
    if all(isinstance(t, int) for t in prompt):
        return [t for t in prompt if isinstance(t, int)]
    raise EmulatorRequestError(
        400, f"batched prompts are not supported by the emulator (got {len(prompt)})", "prompt"
    )


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions`` (one prompt: a string or token ids)."""
    emu = _emu(request)
    req = parse_body(CompletionRequest, await _body(request))
    emu.check_model(req.model)
    gen = emu.prepare(
        _prompt_ids(emu, req.prompt),
        max_tokens=req.max_tokens,
        kind="completion",
        temperature=req.temperature,
        seed=req.seed,
        cache_salt=req.cache_salt,
        n=req.n,
    )
    return await _generate(
        request, emu, gen, chat=False, stream=bool(req.stream), options=req.stream_options
    )


# ---------------------------------------------------------------------- the rest


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the served model with its ``max_model_len``."""
    emu = _emu(request)
    card = {
        "id": emu.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": emu.model,
        "parent": None,
        "max_model_len": emu.max_model_len,
    }
    return _json_response({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    """``GET /health`` and ``/ping``: 200, empty body."""
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    """``GET /version``."""
    from sessionroute import __version__

    return _json_response({"version": f"sessionroute-emulator {__version__}"})


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text with vLLM's names."""
    body = _emu(request).metrics.render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """``POST /reset_prefix_cache``: drop every idle cached block (vLLM dev-mode endpoint)."""
    emu = _emu(request)
    emu.driver.poll()
    dropped = emu.replica.reset_prefix_cache()
    log.debug("reset_prefix_cache dropped %d blocks", dropped)
    return web.Response(status=200)


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``prompt`` or chat ``messages`` to token ids (vLLM's response)."""
    emu = _emu(request)
    req = parse_body(TokenizeRequest, await _body(request))
    emu.check_model(req.model)
    if req.messages is not None:
        pairs = [(m.role, message_text(m)) for m in req.messages]
        ids = emu.chat.encode(pairs, add_generation_prompt=req.add_generation_prompt)
        text = render_chat(pairs, add_generation_prompt=req.add_generation_prompt)
    elif req.prompt is not None:
        text = req.prompt
        ids = emu.tokenizer.encode(text)
    else:
        raise EmulatorRequestError(400, "either 'prompt' or 'messages' is required", "prompt")
    return _json_response(
        {
            "count": len(ids),
            "max_model_len": emu.max_model_len,
            "tokens": ids,
            "token_strs": emu.tokenizer.pieces(text) if req.return_token_strs else None,
        }
    )


async def fault_slowdown(request: web.Request) -> web.Response:
    """``POST /fault/slowdown`` ``{"factor": F}`` (only with ``fault_routes``): every engine
    step from now on takes ``F`` times as long (10: a replica slowed 10x, 1: full speed again);
    requests in flight keep going at the new pace, ``/health`` keeps answering at once.
    Answers ``{"slowdown": F}``; 400 when ``factor`` is missing or not a positive number."""
    emu = _emu(request)
    body = await _body(request)
    factor = body.get("factor") if isinstance(body, dict) else None
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
        raise EmulatorRequestError(400, f"factor must be a positive number, got {factor!r}")
    emu.driver.set_slowdown(float(factor))
    log.warning("fault: slowdown x%g", factor)
    return _json_response({"slowdown": float(factor)})


def build_app(emu: EmulatedReplica) -> web.Application:
    """The aiohttp application serving ``emu``.

    The driver must be started separately (:meth:`RealTimeEngine.start`) in the serving loop.
    """
    app = web.Application(middlewares=[_errors], client_max_size=_MAX_BODY)
    app[EMULATOR_KEY] = emu
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/tokenize", tokenize)
    if emu.settings.fault_routes:
        app.router.add_post("/fault/slowdown", fault_slowdown)
    return app
