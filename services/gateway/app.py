"""The HTTP routes of the Tinker API (tinker SDK 0.38.0's resources/), over Gateway's operations.

Every route but healthz checks the API key (X-API-Key, what the SDK sends from TINKER_API_KEY).
JSON bodies are validated with the SDK's own request models, so a bad field is named as the SDK
names it; refusals answer {"error", "category"} (errors.py).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from tinker import types

from rollway.gateway.callers import CALLER
from rollway.gateway.errors import GatewayError, bad_request
from rollway.gateway.gateway import Gateway
from rollway.gateway.wire import decode_forward_backward

PROTO = "application/x-protobuf"
RETRIEVE_WAIT_S = 10.0  # retrieve_future holds a pending call this long before "try again"
SERVER_FLAGS = {  # ClientConfigResponse: the SDK features this gateway speaks
    "pjwt_auth_enabled": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False,  # one chunk at a time: a model's calls run in arrival order
    "use_pyqwest_transport": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


def parse(model: type, body: Any):
    """`body` as the SDK's request model; bad_request names the invalid fields."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise bad_request(problems) from None


ADAM_FIELDS = tuple(types.AdamParams.model_fields)


def adam_params(body: Any) -> dict[str, float]:
    """optim_step's AdamParams as the trainer's OptimStep fields. The ranges are the trainer's to
    check (a bad value fails the call's future naming the field, as beta2=1 does); JSON carries a
    NaN or an infinity as null (the SDK's pydantic serialisation), passed on as NaN so that the
    trainer refuses it the same way. Another optimizer family is refused here, naming it."""
    if not isinstance(body, dict):
        raise bad_request("body: must be a JSON object")
    field = next((k for k in ("adam_params", "optimizer_params", "optim_params") if k in body), "adam_params")
    params = body.get(field)
    if not isinstance(params, dict):
        raise bad_request(f"{field}: required (AdamParams)")
    if "type" in params:
        raise bad_request(
            f"{field}.type: {params['type']!r} optimizer steps are not supported by this gateway "
            "(its trainers run AdamW: send AdamParams)"
        )
    adam = types.AdamParams().model_dump()
    for name, value in params.items():
        if name not in ADAM_FIELDS:
            raise bad_request(f"{field}.{name}: not a field of AdamParams ({', '.join(ADAM_FIELDS)})")
        if value is None:
            value = float("nan")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"{field}.{name}: must be a number (got {value!r})")
        adam[name] = float(value)
    return adam


def future(request_id: str, model_id: str | None = None) -> dict:
    return {"request_id": request_id, "model_id": model_id}


def tenant_of(key: str, keys: dict[str, str]) -> str | None:
    """The tenant whose API key `key` is (every key compared in constant time), or None."""
    found = None
    for known, tenant in keys.items():
        if hmac.compare_digest(key.encode(), known.encode()):
            found = tenant
    return found


router = APIRouter()


def create_app(gateway: Gateway, keys: dict[str, str]) -> FastAPI:
    """The API over `gateway`; `keys` maps each accepted API key to its tenant's name."""
    app = FastAPI(title="rollway gateway (Tinker API)")
    app.state.gateway, app.state.keys = gateway, keys
    app.middleware("http")(check_key)
    app.add_exception_handler(GatewayError, refused)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.include_router(router)
    return app


async def check_key(request: Request, call_next):
    """Every route but healthz needs a known API key; the tenant is the caller of what follows."""
    if request.url.path != "/api/v1/healthz":
        tenant = tenant_of(request.headers.get("x-api-key", ""), request.app.state.keys)
        if tenant is None:
            return JSONResponse({"error": "X-API-Key: missing or wrong API key", "category": "user"}, 401)
        CALLER.set(tenant)  # the route and the threads it starts run in this context
    return await call_next(request)


async def refused(_request, exc: GatewayError):
    return JSONResponse({"error": exc.message, "category": exc.category}, exc.status)


async def http_error(request, exc: StarletteHTTPException):
    message = (
        f"{request.method} {request.url.path}: not an API route of this gateway"
        if exc.status_code == 404
        else str(exc.detail)
    )
    return JSONResponse({"error": message, "category": "user"}, exc.status_code)


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def _body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise bad_request("body: not valid JSON") from None


async def _off_loop(fn, *args):  # gateway calls block (locks, process starts): off the event loop
    return await asyncio.to_thread(fn, *args)


# --- service ---------------------------------------------------------------------------
@router.get("/api/v1/healthz")
async def healthz():
    return {"status": "ok"}


@router.get("/api/v1/get_server_capabilities")
async def capabilities(request: Request):
    # Any local Hugging Face model directory trains; the list names those being trained.
    return {"supported_models": await _off_loop(_gateway(request).models.supported_models)}


@router.post("/api/v1/client/config")
async def client_config():
    return SERVER_FLAGS


@router.post("/api/v1/client/dynamic_config")
async def client_dynamic_config():
    return {"refresh_interval_sec": 300}


@router.post("/api/v1/telemetry")
async def telemetry():
    return {"status": "accepted"}


@router.post("/api/v1/create_session")
async def create_session(request: Request):
    req = parse(types.CreateSessionRequest, await _body(request))
    return {
        "type": "create_session",
        "session_id": await _off_loop(_gateway(request).create_session, req.user_metadata),
    }


@router.post("/api/v1/session_heartbeat")
async def heartbeat(request: Request):
    req = parse(types.SessionHeartbeatRequest, await _body(request))
    await _off_loop(_gateway(request).heartbeat, req.session_id)
    return {"type": "session_heartbeat"}


@router.post("/api/v1/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request):
    await _off_loop(_gateway(request).end_session, session_id)
    return Response(status_code=200)


# --- models and training ---------------------------------------------------------------
@router.post("/api/v1/create_model")
async def create_model(request: Request):
    req = parse(types.CreateModelRequest, await _body(request))
    return future(await _off_loop(_gateway(request).models.create_model, req.model_dump(mode="json")))


@router.post("/api/v1/get_info")
async def get_info(request: Request):
    req = parse(types.GetInfoRequest, await _body(request))
    return _gateway(request).models.get_info(req.model_id)


@router.post("/api/v1/unload_model")
async def unload_model(request: Request):
    req = parse(types.UnloadModelRequest, await _body(request))
    return future(await _off_loop(_gateway(request).models.unload_model, req.model_id), req.model_id)


@router.post("/api/v1/forward_backward")
async def forward_backward(request: Request):
    if PROTO not in request.headers.get("content-type", ""):
        raise bad_request(f"Content-Type: forward_backward takes {PROTO} (as the tinker SDK sends it)")
    call = decode_forward_backward(await request.body(), request.headers.get("content-encoding", ""))
    return future(await _off_loop(_gateway(request).models.forward_backward, call), call.model_id)


@router.post("/api/v1/optim_step")
async def optim_step(request: Request):
    raw = await _body(request)
    adam = adam_params(raw)
    if not isinstance(raw.get("model_id"), str):
        raise bad_request("model_id: required")
    return future(
        await _off_loop(_gateway(request).models.optim_step, raw["model_id"], adam), raw["model_id"]
    )


@router.post("/api/v1/save_weights")
async def save_weights(request: Request):
    req = parse(types.SaveWeightsRequest, await _body(request))
    return future(
        await _off_loop(_gateway(request).checkpoints.save_weights, req.model_dump(), "weights"), req.model_id
    )


@router.post("/api/v1/save_weights_for_sampler")
async def save_weights_for_sampler(request: Request):
    req = parse(types.SaveWeightsForSamplerRequest, await _body(request))
    return future(
        await _off_loop(_gateway(request).checkpoints.save_weights, req.model_dump(), "sampler_weights"),
        req.model_id,
    )


@router.post("/api/v1/load_weights")
async def load_weights(request: Request):
    req = parse(types.LoadWeightsRequest, await _body(request))
    return future(
        await _off_loop(_gateway(request).checkpoints.load_weights, req.model_dump(mode="json")), req.model_id
    )


@router.post("/api/v1/weights_info")
async def weights_info(request: Request):
    raw = await _body(request)
    if not isinstance(raw, dict) or not isinstance(raw.get("tinker_path"), str):
        raise bad_request("tinker_path: required (a tinker:// path)")
    return await _off_loop(_gateway(request).checkpoints.weights_info, raw["tinker_path"])


# --- sampling --------------------------------------------------------------------------
@router.post("/api/v1/create_sampling_session")
async def create_sampling_session(request: Request):
    req = parse(types.CreateSamplingSessionRequest, await _body(request))
    sid = await _off_loop(
        _gateway(request).sampling.create_sampling_session, req.session_id, req.model_path, req.base_model
    )
    return {"type": "create_sampling_session", "sampling_session_id": sid}


@router.get("/api/v1/samplers/{sampler_id}")
async def sampler_info(sampler_id: str, request: Request):
    return _gateway(request).sampling.sampler_info(sampler_id)


@router.post("/api/v1/asample")
async def asample(request: Request):
    raw = await _body(request)
    req = parse(types.SampleRequest, raw)
    request_id = await _off_loop(_gateway(request).sampling.sample, raw)
    # The SDK stamps these on the returned sequences, in order.
    return {
        **future(request_id),
        "sample_sequence_ids": [f"{request_id}-{k}" for k in range(req.num_samples)],
    }


# --- futures ---------------------------------------------------------------------------
@router.post("/api/v1/retrieve_future")
async def retrieve_future(request: Request):
    req = parse(types.FutureRetrieveRequest, await _body(request))
    try:
        done = await _off_loop(_gateway(request).futures.wait, req.request_id, RETRIEVE_WAIT_S)
    except KeyError:
        # A failed future, not a 404 (which the SDK raises as a plain ValueError): the call was
        # lost with a gateway restart or its model's release; repeating it is the way on.
        return {
            "error": f"request_id: {req.request_id!r} is unknown to this gateway: it was issued before the "
            "gateway restarted, or its model was released; the call's work is lost, repeat it",
            "category": "server",
        }
    if done is None:
        return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
    exc = done.exception()
    if isinstance(exc, GatewayError):
        return {"error": exc.message, "category": exc.category}
    if exc is not None:
        return {"error": f"{type(exc).__name__}: {exc}", "category": "server"}
    result = done.result()
    if isinstance(result, bytes):
        return Response(result, media_type=PROTO)
    return result


# --- listing ---------------------------------------------------------------------------
@router.get("/api/v1/training_runs")
async def training_runs(request: Request):
    runs = await _off_loop(_gateway(request).runs.training_runs)
    return {"training_runs": runs, "cursor": {"offset": 0, "limit": len(runs), "total_count": len(runs)}}


@router.get("/api/v1/training_runs/{model_id}")
async def training_run(model_id: str, request: Request):
    return await _off_loop(_gateway(request).runs.training_run, model_id)


@router.get("/api/v1/training_runs/{model_id}/checkpoints")
async def checkpoints(model_id: str, request: Request):
    return {"checkpoints": await _off_loop(_gateway(request).runs.checkpoints, model_id)}


@router.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(model_id: str, checkpoint_id: str, request: Request):
    await _off_loop(_gateway(request).checkpoints.delete_checkpoint, model_id, checkpoint_id)
    return Response(status_code=204)


@router.put("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/ttl")
async def checkpoint_ttl(model_id: str, checkpoint_id: str, request: Request):
    raw = await _body(request)
    ttl = raw.get("ttl_seconds") if isinstance(raw, dict) else None
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
        raise bad_request(f"ttl_seconds: must be an integer or null (got {ttl!r})")
    await _off_loop(_gateway(request).checkpoints.set_checkpoint_ttl, model_id, checkpoint_id, ttl)
    return Response(status_code=204)


@router.get("/api/v1/checkpoints")
async def user_checkpoints(request: Request, limit: int = 100, offset: int = 0):
    return await _off_loop(_gateway(request).runs.user_checkpoints, limit, offset)


@router.get("/api/v1/sessions")
async def sessions(request: Request, limit: int = 20, offset: int = 0):
    return await _off_loop(_gateway(request).list_sessions, limit, offset)


@router.get("/api/v1/sessions/{session_id}")
async def session(session_id: str, request: Request):
    return await _off_loop(_gateway(request).get_session, session_id)
