"""The dashboard's HTTP API and pages (FastAPI): JSON for each view, and server-sent events.

    GET  /                                   the single-page UI (static/)
    GET  /api/runs                           every run: state, progress, ETA
    GET  /api/runs/{id}                      ... and its config (as given and resolved), result
    POST /api/runs/{id}/stop                 StopRun (live runs of this coordinator)
    GET  /api/runs/{id}/metrics              the records of metrics.jsonl
    GET  /api/runs/{id}/rollouts[/{step}]    steps with stored samples; one step's groups
    GET  /api/runs/{id}/services             services: address, health, pid, version, log tail
    GET  /api/runs/{id}/timeline             each step's time by phase; weight-sync timings
    GET  /api/runs/{id}/trace/{step}         one step's spans across the services
    GET  /api/events?runs=a,b                SSE: new metrics records, run states, rollout steps

With a token, every request needs `Authorization: Bearer TOKEN`, a `token` query parameter (the
first page load; it is then kept in a cookie, as EventSource cannot send headers) or that cookie.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from rollway.coordinator.dashboard import rollout_samples, run_files, views
from rollway.coordinator.dashboard.runs_view import DashboardRuns

TOKEN_COOKIE = "rollway_token"
EVENT_POLL_SECONDS = 0.5  # how often the event stream looks at the run's files


def static_dir() -> Path:
    return Path(str(resources.files("rollway.coordinator.dashboard") / "static"))


router = APIRouter()


def create_app(runs: DashboardRuns, *, token: str = "", trace_file: str = "") -> FastAPI:
    # FastAPI's own OpenTelemetry spans are off: looking at a run must not add to its trace.
    telemetry = {
        "tracing": False,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
    }
    app = FastAPI(
        title="rollway dashboard", docs_url=None, redoc_url=None, openapi_url=None, telemetry=telemetry
    )
    app.state.runs, app.state.token = runs, token
    app.state.trace_file = Path(trace_file) if trace_file else None
    app.middleware("http")(authenticate)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
    return app


async def authenticate(request: Request, call_next):
    """Every request carries the token (header, query parameter or cookie) when the app has one."""
    token = request.app.state.token
    if not token:
        return await call_next(request)
    given = request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE, "")
    header = request.headers.get("authorization", "") or (f"Bearer {given}" if given else "")
    if not hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return JSONResponse({"detail": "missing or invalid auth token"}, status_code=401)
    response = await call_next(request)
    if request.query_params.get("token"):
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


def _runs(request: Request) -> DashboardRuns:
    return request.app.state.runs


def _run_dir(request: Request, run_id: str) -> Path:
    try:
        return _runs(request).run_dir(run_id)
    except KeyError:
        raise HTTPException(404, f"no run {run_id!r}") from None


@router.get("/")
def index():
    return FileResponse(static_dir() / "index.html")


@router.get("/api/runs")
def list_runs(request: Request):
    runs = _runs(request)
    return [runs.summary(run_id) for run_id in runs.run_ids()]


@router.get("/api/runs/{run_id}")
def get_run(run_id: str, request: Request):
    directory = _run_dir(request, run_id)
    config = run_files.read_json(directory / "config.json")
    given = config.pop("given", {})
    return {
        **_runs(request).summary(run_id),
        "config_given": given,
        "config_resolved": config,
        "result": run_files.read_json(directory / "result.json"),
    }


@router.post("/api/runs/{run_id}/stop")
def stop_run(run_id: str, request: Request, immediate: bool = False):
    _run_dir(request, run_id)
    try:
        return _runs(request).stop(run_id, immediate)
    except PermissionError as exc:
        raise HTTPException(409, str(exc)) from None


@router.get("/api/runs/{run_id}/metrics")
def metrics(run_id: str, request: Request):
    records, _ = run_files.read_metrics(_run_dir(request, run_id))
    return {"run_id": run_id, "records": records}


@router.get("/api/runs/{run_id}/rollouts")
def rollout_steps(run_id: str, request: Request):
    return {"run_id": run_id, "steps": rollout_samples.stored_steps(_run_dir(request, run_id))}


@router.get("/api/runs/{run_id}/rollouts/{step}")
def rollout_step(run_id: str, step: int, request: Request):
    try:
        return views.rollout_groups(_run_dir(request, run_id), step)
    except FileNotFoundError:
        raise HTTPException(404, f"no rollout samples kept for step {step} of {run_id}") from None


@router.get("/api/runs/{run_id}/services")
def services(run_id: str, request: Request):
    directory = _run_dir(request, run_id)
    records, _ = run_files.read_metrics(directory)
    runs = _runs(request)
    return {
        "services": views.services(directory, runs.live(run_id), runs.coordinator_address),
        "weight_syncs": views.weight_syncs(records),
    }


@router.get("/api/runs/{run_id}/timeline")
def timeline(run_id: str, request: Request):
    directory = _run_dir(request, run_id)
    records, _ = run_files.read_metrics(directory)
    trace = views.trace_file_of(directory, request.app.state.trace_file)
    return {
        "phases": [label for label, _ in views.STEP_PHASES] + ["other"],
        "steps": views.step_times(records, trace),
    }


@router.get("/api/runs/{run_id}/trace/{step}")
def step_trace(run_id: str, step: int, request: Request):
    return views.trace(_run_dir(request, run_id), step, request.app.state.trace_file)


@router.get("/api/events")
async def events(request: Request, runs: str = ""):
    wanted = [r for r in runs.split(",") if r]
    return EventSourceResponse(_event_stream(request, _runs(request), wanted))


async def _event_stream(request: Request, runs: DashboardRuns, wanted: list[str]):
    """New metrics records of the wanted runs, run summaries when they change, and newly stored
    rollout steps; read from the files every EVENT_POLL_SECONDS (never from the run thread)."""
    lines: dict[str, int] = {}
    steps: dict[str, list[int]] = {}
    last_summaries = None
    while not await request.is_disconnected():
        summaries = await run_in_threadpool(lambda: [runs.summary(r) for r in runs.run_ids()])
        if summaries != last_summaries:
            last_summaries = summaries
            yield {"event": "runs", "data": json.dumps(summaries)}
        for run_id in wanted:
            try:
                directory = runs.run_dir(run_id)
            except KeyError:
                continue
            records, lines[run_id] = await run_in_threadpool(
                run_files.read_metrics, directory, lines.get(run_id, 0)
            )
            if records:
                yield {"event": "metrics", "data": json.dumps({"run_id": run_id, "records": records})}
            stored = await run_in_threadpool(rollout_samples.stored_steps, directory)
            if stored != steps.get(run_id):
                steps[run_id] = stored
                yield {"event": "rollouts", "data": json.dumps({"run_id": run_id, "steps": stored})}
        await asyncio.sleep(EVENT_POLL_SECONDS)
