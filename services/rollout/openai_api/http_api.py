"""The OpenAI-compatible HTTP endpoint of agent episodes (FastAPI, uvicorn in a daemon thread).

    POST /episodes/{episode_id}/v1/chat/completions   messages (+ tools) -> the model's turn
    POST /episodes/{episode_id}/v1/completions        prompt text -> the model's turn
    POST /episodes/{episode_id}/v1/reward             {"reward": x}: the episode's reward
    GET  /episodes/{episode_id}/v1/models             the served model
    POST /v1/chat/completions, /v1/completions        outside episodes: the current policy
                                                      (policy_api.py; nothing is recorded)

A request waits (asynchronously) for its episode's model turn; `stream: true` sends the finished
turn as OpenAI server-sent-event chunks (the turn is generated whole, then streamed). Sampling
settings of a request are not used: an episode samples with the run's settings, so that its
log-probs are those the trainer expects. Errors are OpenAI error objects with a status: 400 bad
request (naming what is wrong), 401 without the service's token, 404 unknown or finished episode.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import grpc
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from rollway.common.errors import RollwayError
from rollway.common.log import get_logger
from rollway.rollout.environments.agent import CHAT, COMPLETION, AgentRequest, HttpError
from rollway.rollout.openai_api import policy_api
from rollway.rollout.openai_api.chat_format import BadRequest

if TYPE_CHECKING:
    from rollway.rollout.environments.agent_hub import AgentHub

log = get_logger("rollway.rollout.agents.http")
START_SECONDS = 30.0
# Generate's refusals as HTTP statuses.
STATUS_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
STREAM_PIECE_CHARS = 8  # characters of content per streamed chunk


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    return JSONResponse(
        {"error": {"message": message, "type": kind.get(status, "api_error"), "code": status}}, status
    )


def _chunks(response: dict) -> Iterator[dict]:
    """A finished response as the chunks of a stream whose concatenation gives it back."""
    base = {k: response[k] for k in ("id", "created", "model")}
    choice = response["choices"][0]
    if response["object"] == COMPLETION:
        text = choice["text"]
        for i in range(0, len(text), STREAM_PIECE_CHARS):
            piece = {"index": 0, "text": text[i : i + STREAM_PIECE_CHARS], "finish_reason": None}
            yield {**base, "object": COMPLETION, "choices": [piece]}
        last = {"index": 0, "text": "", "finish_reason": choice["finish_reason"]}
        yield {**base, "object": COMPLETION, "choices": [last], "rollway": response["rollway"]}
        return
    chunk = {**base, "object": "chat.completion.chunk"}
    delta = lambda d, finish=None: {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}  # noqa: E731
    yield delta({"role": "assistant", "content": ""})
    message = choice["message"]
    content = message.get("content") or ""
    for i in range(0, len(content), STREAM_PIECE_CHARS):
        yield delta({"content": content[i : i + STREAM_PIECE_CHARS]})
    calls = message.get("tool_calls") or []
    if calls:
        yield delta({"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]})
    yield {**delta({}, choice["finish_reason"]), "usage": response["usage"], "rollway": response["rollway"]}


router = APIRouter()
UNAUTHORISED = "missing or wrong API key (the rollout service's --auth-token)"


def create_app(hub: AgentHub) -> FastAPI:
    app = FastAPI(title="rollway agent episodes", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hub = hub
    app.include_router(router)
    return app


def _hub(request: Request) -> AgentHub:
    return request.app.state.hub


def _authorised(request: Request) -> bool:
    token = _hub(request).auth_token
    if not token:
        return True
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


async def _body_of(request: Request) -> dict:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise HttpError(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body


def _answer(response: dict, body: dict):
    """The response whole, or as server-sent-event chunks when the request asked for a stream."""
    if not body.get("stream"):
        return response
    lines = (f"data: {json.dumps(c)}\n\n" for c in _chunks(response))
    return StreamingResponse(iter([*lines, "data: [DONE]\n\n"]), media_type="text/event-stream")


async def _turn(kind: str, episode_id: str, request: Request):
    """An episode's model turn: the request waits for it (environments/agent.py)."""
    if not _authorised(request):
        return _error(401, UNAUTHORISED)
    try:
        body = await _body_of(request)
        episode = _hub(request).find(episode_id)
        if episode is None:
            raise HttpError(404, f"no running episode {episode_id!r}")
        if body.get("n", 1) != 1:
            raise HttpError(400, "n must be 1: an episode is one sample")
        reply: Future = Future()
        episode.submit(AgentRequest(kind, body, reply))
        response = await asyncio.wrap_future(reply)
    except HttpError as exc:
        return _error(exc.status, str(exc))
    return _answer(response, body)


async def _plain(kind: str, request: Request):
    """A request outside episodes: the current policy answers (policy_api.py; nothing is recorded)."""
    if not _authorised(request):
        return _error(401, UNAUTHORISED)
    hub = _hub(request)
    try:
        body = await _body_of(request)
        call = policy_api.generate_request(kind, body, hub.encoder, hub.config)
        samples = await asyncio.to_thread(hub.generate, call)
    except HttpError as exc:
        return _error(exc.status, str(exc))
    except BadRequest as exc:
        return _error(400, str(exc))
    except RollwayError as exc:  # refused by Generate's own checks, queue or state
        return _error(STATUS_OF.get(exc.code, 500), str(exc))
    answer = policy_api.response(
        kind,
        body,
        samples,
        model=hub.model_name,
        parser=hub.config.generate_tool_call_parser,
        decode_token=hub.decode_token,
    )
    return _answer(answer, body)


@router.post("/v1/chat/completions")
async def plain_chat_completions(request: Request):
    return await _plain(CHAT, request)


@router.post("/v1/completions")
async def plain_completions(request: Request):
    return await _plain(COMPLETION, request)


@router.get("/v1/models")
async def plain_models(request: Request):
    return await models("", request)


@router.post("/episodes/{episode_id}/v1/chat/completions")
async def chat_completions(episode_id: str, request: Request):
    return await _turn(CHAT, episode_id, request)


@router.post("/episodes/{episode_id}/v1/completions")
async def completions(episode_id: str, request: Request):
    return await _turn(COMPLETION, episode_id, request)


@router.post("/episodes/{episode_id}/v1/reward")
async def reward(episode_id: str, request: Request):
    if not _authorised(request):
        return _error(401, UNAUTHORISED)
    try:
        body = await _body_of(request)
        value = body.get("reward")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise HttpError(400, "reward must be a number")
        episode = _hub(request).find(episode_id)
        if episode is None:
            raise HttpError(404, f"no running episode {episode_id!r}")
        episode.post_reward(float(value))
    except HttpError as exc:
        return _error(exc.status, str(exc))
    return {"episode_id": episode_id, "reward": float(value)}


@router.get("/episodes/{episode_id}/v1/models")
async def models(episode_id: str, request: Request):
    if not _authorised(request):
        return _error(401, UNAUTHORISED)
    model = _hub(request).model_name
    return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "rollway"}]}


class OpenAIServer:
    """Serves the app on host:port (0: a free port) in a daemon thread until stop()."""

    def __init__(self, app, host: str, port: int):
        import uvicorn

        self.host = host
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # bound here, so a taken port fails now, naming it
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="openai-api", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        except Exception as exc:  # the endpoint is gone: the agents' requests fail, the service goes on
            log.error("OpenAI-compatible endpoint stopped", error=str(exc))

    def start(self) -> OpenAIServer:
        self._thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            threading.Event().wait(0.02)  # uvicorn offers no started event to wait on
        if not self._server.started:
            raise RuntimeError(f"the OpenAI-compatible endpoint did not start on {self.url}")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self._socket.close()
