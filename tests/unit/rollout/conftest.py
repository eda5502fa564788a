"""A protocol test peer for the sglang engine: a real HTTP server on loopback that records each
request and answers the way SGLang's http_server.py does (SGLang itself needs CUDA)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class SGLangPeer:
    """Records (method, path, body); `routes[path]` may override the reply: fn(body) -> (status, payload)."""

    def __init__(self):
        self.requests: list[tuple[str, str, object]] = []
        self.queries: list[str] = []  # the query string of each request, in the same order
        self.routes = {}
        self.aborted: dict[str, threading.Event] = {}
        self.hold_generate = False  # /generate waits for /abort_request of its rid
        self.lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path, _, query = self.path.partition("?")
                with peer.lock:
                    peer.requests.append((method, path, body))
                    peer.queries.append(query)
                status, payload = peer.reply(method, path, body)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def calls(self, path):
        with self.lock:
            return [body for _, p, body in self.requests if p == path]

    def reply(self, method, path, body):
        if path in self.routes:
            return self.routes[path](body)
        if path in ("/health_generate", "/health"):
            return 200, ""
        if path == "/generate":
            return self._generate(body)
        if path == "/abort_request":
            self.aborted.setdefault(body["rid"], threading.Event()).set()
            return 200, ""
        if path in ("/pause_generation", "/continue_generation"):
            verb = "paused" if "pause" in path else "continued"
            return 200, {"message": f"Generation {verb} successfully.", "status": "ok"}
        if path == "/flush_cache":
            return 200, "Cache flushed.\n"
        if path in ("/release_memory_occupation", "/resume_memory_occupation"):
            return 200, ""
        if path in (
            "/init_weights_update_group",
            "/update_weights_from_distributed",
            "/update_weights_from_disk",
        ):
            return 200, {"success": True, "message": "Succeeded to update parameter online."}
        return 404, {"detail": "Not Found"}

    def _generate(self, body):
        """Echo-style output: response token k is prompt[0] + k, log-prob -0.1 * (k + 1)."""
        n = body["sampling_params"]["max_new_tokens"]
        finish = {"type": "length", "length": n}
        if self.hold_generate:
            aborted = self.aborted.setdefault(body["rid"], threading.Event()).wait(10)
            n, finish = (2, {"type": "abort", "message": "Abort request"}) if aborted else (n, finish)
        tokens = [body["input_ids"][0] + k for k in range(n)]
        meta = {
            "id": body["rid"],
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": n,
            "output_token_logprobs": [[-0.1 * (k + 1), t, None] for k, t in enumerate(tokens)],
            "weight_version": "default",
        }
        return 200, {"text": f"text-{body['rid'][-4:]}", "output_ids": tokens, "meta_info": meta}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sglang_peer():
    peers = []

    def make() -> SGLangPeer:
        peers.append(SGLangPeer())
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()
