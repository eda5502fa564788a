"""A small client for one SGLang server's native HTTP API (stdlib only), and the mapping of rollway
samples to /generate bodies and back.

Endpoints and bodies follow SGLang's http_server.py and io_struct.py:
  POST /generate                  {"input_ids", "sampling_params", "return_logprob", "rid"}
       -> {"text", "output_ids", "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", ...},
           "output_token_logprobs": [[logprob, token_id, text|null], ...], "weight_version", ...}}
  GET  /health_generate, /health  -> 200 when healthy, 503 while starting or unhealthy
  POST /pause_generation {"mode"}, /continue_generation {}, /abort_request {"rid" | "abort_all"}
  GET|POST /flush_cache[?timeout=s] -> 200, or 400 while requests are running (with a timeout, the
       scheduler waits up to that long for them to end)
  POST /release_memory_occupation, /resume_memory_occupation {"tags"}
  POST /begin_weight_update {}, /end_weight_update {}  (0.5.21+: a weight-update session; the
       distributed update is refused with 400 outside one; 404 on servers without sessions)
  POST /destroy_weights_update_group {"group_name"}  (leave the group: its sender's broadcast fails)
  GET  /get_model_info            -> {"model_path", "weight_version", ...}
  POST /weights_checker {"action": "checksum" | "reset_tensors"}  -> {"success", "ranks": [{
       "checksums": {name: hash}, "per_gpu_checksum"}]}  (SGLang's own hash of its fused tensors)
  POST /init_weights_update_group {"master_address", "master_port", "rank_offset", "world_size",
       "group_name", "backend"}, /update_weights_from_distributed {"names", "dtypes", "shapes",
       "group_name", "flush_cache", "weight_version", "load_format"}, /update_weights_from_disk {"model_path",
       "weight_version", "flush_cache"}  -> {"success": bool, "message": str}, 400 when not successful
Errors: 400 with {"error": {"message"}} (ValueError in a handler), {"object": "error", "message",
"code"} (validation), or {"success": false, "message"} (weight endpoints).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any

from rollway.rollout.engines.base import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, SampleRequest, SampleResult
from rollway.rollout.sampling import SamplingParams

# SGLang servers are reached directly, never through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SGLangHTTPError(RuntimeError):
    """A non-2xx answer (status > 0) or no answer at all (status 0: connection refused, timeout)."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"sglang {url}: HTTP {status}: {message}" if status else f"sglang {url}: {message}")
        self.url = url
        self.status = status
        self.message = message


def error_message(payload: Any) -> str:
    """The human message inside any of SGLang's error shapes."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in payload:
            return str(payload["message"])
        if "detail" in payload:
            return str(payload["detail"])
    return str(payload)[:500]


def _decode(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


class SGLangClient:
    """Calls one server at `base_url` (e.g. http://127.0.0.1:30000)."""

    def __init__(self, base_url: str, timeout: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """The decoded reply (JSON or text); SGLangHTTPError on a non-2xx answer or no answer."""
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with _OPENER.open(request, timeout=timeout or self.timeout) as reply:
                return _decode(reply.read())
        except urllib.error.HTTPError as exc:
            raise SGLangHTTPError(url, exc.code, error_message(_decode(exc.read()))) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SGLangHTTPError(url, 0, f"no answer: {reason}") from None

    def post(self, path: str, body: Any = None, timeout: float | None = None) -> Any:
        return self.request("POST", path, {} if body is None else body, timeout)

    def _post_success(self, path: str, body: dict[str, Any]) -> str:
        """POST to an endpoint answering {"success", "message"}; raise unless success."""
        reply = self.post(path, body)
        if not isinstance(reply, dict) or reply.get("success") is not True:
            raise SGLangHTTPError(self.base_url + path, 200, error_message(reply))
        return str(reply.get("message", ""))

    # --- generation ---

    def generate(
        self, input_ids: list[int], sampling_params: dict[str, Any], rid: str, timeout: float
    ) -> dict:
        body = {
            "input_ids": input_ids,
            "sampling_params": sampling_params,
            "return_logprob": True,
            "rid": rid,
        }
        reply = self.post("/generate", body, timeout)
        if not isinstance(reply, dict) or "meta_info" not in reply:
            raise SGLangHTTPError(self.base_url + "/generate", 200, f"unexpected reply: {str(reply)[:200]}")
        return reply

    def healthy(self, timeout: float = 30.0) -> bool:
        try:
            self.request("GET", "/health_generate", timeout=timeout)
            return True
        except SGLangHTTPError:
            return False

    def answers(self, timeout: float = 5.0) -> bool:
        """GET /health answers 200: the server is up (cheaper than a generation)."""
        try:
            self.request("GET", "/health", timeout=timeout)
            return True
        except SGLangHTTPError:
            return False

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.post("/abort_request", {"rid": rid, "abort_all": abort_all})

    def pause_generation(self, mode: str = "abort") -> None:
        self.post("/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self.post("/continue_generation", {})

    def flush_cache(self, timeout: float = 0.0) -> None:
        """Flush the radix cache; with `timeout`, SGLang waits up to that long for running requests
        to end (an aborted request leaves the batch at the scheduler's next step, not at once)."""
        if timeout:
            self.post(f"/flush_cache?timeout={timeout:g}", timeout=timeout + self.timeout)
        else:
            self.post("/flush_cache")

    # --- memory ---

    def release_memory_occupation(self, tags: list[str]) -> None:
        self.post("/release_memory_occupation", {"tags": tags})

    def resume_memory_occupation(self, tags: list[str]) -> None:
        self.post("/resume_memory_occupation", {"tags": tags})

    # --- weights ---

    def weight_version(self) -> str:
        """The version the server says it serves ("default" until its first update)."""
        reply = self.request("GET", "/get_model_info")
        return str(reply.get("weight_version", "")) if isinstance(reply, dict) else ""

    def device(self) -> str:
        """The device the server runs on ("cuda", "cpu", ...: its server_args.device)."""
        reply = self.request("GET", "/get_server_info")
        return str(reply.get("device", "")) if isinstance(reply, dict) else ""

    def weights_checker(self, action: str) -> dict:
        """SGLang's weight checker: "checksum" (its own per-tensor hashes) or "reset_tensors"
        (random values in every weight)."""
        reply = self.post("/weights_checker", {"action": action})
        if not isinstance(reply, dict) or reply.get("success") is not True:
            raise SGLangHTTPError(self.base_url + "/weights_checker", 200, error_message(reply))
        return reply

    def begin_weight_update(self) -> bool:
        """Open a weight-update session; False when the server has no sessions (404: before 0.5.21)."""
        try:
            self.post("/begin_weight_update", {})
        except SGLangHTTPError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def end_weight_update(self) -> None:
        self.post("/end_weight_update", {})

    def destroy_weights_update_group(self, group_name: str) -> None:
        self.post("/destroy_weights_update_group", {"group_name": group_name})

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> str:
        body = dict(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        return self._post_success("/init_weights_update_group", body)

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> str:
        body = dict(
            names=names,
            dtypes=dtypes,
            shapes=shapes,
            group_name=group_name,
            flush_cache=flush_cache,
            weight_version=str(weight_version),
        )
        if load_format:  # "flattened_bucket": one broadcast of the packed tensors (rollway's buckets)
            body["load_format"] = load_format
        return self._post_success("/update_weights_from_distributed", body)

    def update_weights_from_disk(self, model_path: str, weight_version: int, flush_cache: bool = True) -> str:
        body = {"model_path": model_path, "weight_version": str(weight_version), "flush_cache": flush_cache}
        return self._post_success("/update_weights_from_disk", body)


# --- mapping rollway samples to and from SGLang bodies ---

FINISH_TYPES = {"stop": FINISH_STOP, "length": FINISH_LENGTH, "abort": FINISH_ABORT}


def sampling_params_body(params: SamplingParams) -> dict[str, Any]:
    """SGLang's sampling_params for one sample (its per-sample seed is `sampling_seed`)."""
    body: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": sorted(params.stop_token_ids),
        "stop": list(params.stop),
        "skip_special_tokens": True,
    }
    if params.seed is not None:
        body["sampling_seed"] = params.seed
    return body


def parse_generate_reply(request: SampleRequest, reply: dict, default_version: int) -> SampleResult:
    """A SampleResult from a /generate reply (tokens and log-probs from output_token_logprobs)."""
    meta = reply.get("meta_info") or {}
    entries = meta.get("output_token_logprobs") or []
    finish = meta.get("finish_reason") or {}
    finish_type = finish.get("type") if isinstance(finish, dict) else str(finish)
    if finish_type not in FINISH_TYPES:
        return SampleResult(request, error=f"sglang reply without a known finish_reason: {str(finish)[:200]}")
    version = meta.get("weight_version", default_version)
    try:
        version = int(version)
    except (TypeError, ValueError):
        version = default_version
    return SampleResult(
        request=request,
        token_ids=[int(entry[1]) for entry in entries],
        log_probs=[float(entry[0]) for entry in entries],
        finish_reason=FINISH_TYPES[finish_type],
        text=str(reply.get("text", "")),
        weight_version=version,
    )
