"""The sglang engine's process supervision (with a stand-in server script, a real process it
restarts and kills) and the real SGLang server, which runs only with a GPU."""

import os
import queue
import signal
import sys

import pytest
from support.ports import free_port

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import EngineError, SampleRequest
from rollway.rollout.engines.sglang import SGLangEngine
from rollway.rollout.engines.sglang_server import ServerProcess, Supervisor
from rollway.rollout.sampling import SamplingParams


def _request(index, prompt=(5, 6, 7), **params):
    return SampleRequest(index=index, prompt_token_ids=prompt, params=SamplingParams(**params), prompt_key=0)


STAND_IN = """
import os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, mode = int(sys.argv[1]), sys.argv[2]
flag = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unhealthy")
if mode == "crash":
    print("CUDA error: out of memory", flush=True)
    sys.exit(3)
time.sleep(0.3)  # starting up: nothing listens yet
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503 if os.path.exists(flag) else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _stand_in(tmp_path, mode: str) -> ServerProcess:
    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN)
    port = free_port()
    return ServerProcess(
        [sys.executable, str(script), str(port), mode],
        f"http://127.0.0.1:{port}",
        tmp_path / f"server-{port}.log",
        request_timeout=5,
    )


def test_supervisor_restarts_a_dead_server(tmp_path):
    server = _stand_in(tmp_path, "ok")
    restarted = []
    supervisor = Supervisor(
        [server], startup_timeout=30, interval=3600, max_restarts=2, on_restart=restarted.append
    )
    supervisor.start()
    try:
        first_pid = server.proc.pid
        assert server.healthy
        os.kill(first_pid, signal.SIGKILL)
        server.proc.wait(10)
        supervisor.check_once()
        assert server.healthy and server.restarted and server.num_restarts == 1
        assert server.proc.pid != first_pid and server.alive() and restarted == [server]
    finally:
        supervisor.stop()
    assert server.proc.poll() is not None  # stopped by its process group


def test_supervisor_restarts_an_unhealthy_server_after_three_failed_checks(tmp_path):
    server = _stand_in(tmp_path, "ok")
    supervisor = Supervisor([server], startup_timeout=3, interval=3600, max_restarts=1)
    supervisor.start()
    try:
        first_pid = server.proc.pid
        (tmp_path / "unhealthy").touch()  # from now on /health_generate answers 503
        for _ in range(2):
            supervisor.check_once()
        assert server.proc.pid == first_pid and not server.healthy and server.num_restarts == 0
        supervisor.check_once()  # third failure: restart (the new one stays unhealthy too)
        assert server.num_restarts == 1 and server.proc.pid != first_pid and not server.healthy
    finally:
        supervisor.stop()


def test_a_server_that_dies_at_start_up_reports_its_log(tmp_path):
    server = _stand_in(tmp_path, "crash")
    supervisor = Supervisor([server], startup_timeout=30, interval=3600, max_restarts=0)
    with pytest.raises(EngineError, match="exited with 3:(.|\n)*CUDA error: out of memory"):
        supervisor.start()
    supervisor.stop()


@pytest.mark.gpu
def test_real_sglang_server_generates_with_log_probs(tiny_model_dir, tmp_path):
    pytest.importorskip("sglang")
    config = RolloutConfig(
        hf_checkpoint=str(tiny_model_dir),
        rollout_engine="sglang",
        sglang_log_dir=str(tmp_path),
        sglang_port=free_port(),
        sglang_mem_fraction_static=0.3,
    )
    engine = SGLangEngine(config)
    engine.start()
    try:
        results = queue.Queue()
        engine.submit(
            [_request(i, prompt=(1, 50, 60), temperature=1.0, max_new_tokens=16, seed=i) for i in range(4)],
            results.put,
        )
        out = [results.get(timeout=120) for _ in range(4)]
    finally:
        engine.stop()
    for result in out:
        assert result.error == "" and 0 < len(result.token_ids) == len(result.log_probs) <= 16
        assert all(lp <= 0 for lp in result.log_probs)
