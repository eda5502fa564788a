"""The shared runtime over real servers on loopback: health, drain, auth, TLS, errors, retries, logs, traces."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.ports import free_port
from support.probe_service import SERVICE
from support.processes import ServiceProcess
from support.waiting import wait_until

from rollway.common.client import ClientConfig, RetryingStream, open_channel

TESTS_DIR = str(Path(__file__).resolve().parents[1])
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def probe(workdir: Path, *args: str, env: dict[str, str] | None = None, **kwargs) -> ServiceProcess:
    env = {"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return ServiceProcess("probe", list(args), workdir, module="support.probe_service", env=env, **kwargs)


def call(channel: grpc.Channel, method: str, payload: bytes = b"", **kwargs) -> bytes:
    return channel.unary_unary(f"/{SERVICE}/{method}")(payload, **kwargs)


def test_health_goes_serving_then_not_serving_on_sigterm_and_in_flight_call_completes(tmp_path):
    svc = probe(tmp_path, "--ready-after", "1.5", "--grace-seconds", "5", wait_serving=False).start()
    try:
        channel = open_channel(svc.address)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == NOT_SERVING
        statuses: list[int] = []
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=30)
        watcher = threading.Thread(target=lambda: [statuses.append(r.status) for r in _until_error(watch)])
        watcher.start()
        deadline = time.monotonic() + 20
        while SERVING not in statuses and time.monotonic() < deadline:
            time.sleep(0.05)
        assert statuses[:2] == [NOT_SERVING, SERVING]

        result: dict[str, bytes] = {}
        in_flight = threading.Thread(
            target=lambda: result.update(reply=call(channel, "Sleep", b"2.0", timeout=30))
        )
        in_flight.start()
        wait_until(lambda: "probe sleeping" in svc.log_text(), 20, "the Sleep call to be handled")
        svc.signal(signal.SIGTERM)
        in_flight.join(30)
        watch.cancel()
        watcher.join(10)
        assert result == {"reply": b"slept"}, "the in-flight call must finish during the drain"
        assert statuses[-1] == NOT_SERVING
        assert svc.proc.wait(30) == 0
        with pytest.raises(grpc.RpcError) as refused:
            call(open_channel(svc.address, ClientConfig(max_retries=0)), "Sleep", b"0", timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        svc.stop()


def _until_error(stream):
    try:
        yield from stream
    except grpc.RpcError:
        return


def test_token_auth_refuses_calls_without_the_token(tmp_path):
    with probe(tmp_path, "--auth-token", "s3cret") as svc:
        anonymous = open_channel(svc.address)
        with pytest.raises(grpc.RpcError) as refused:
            call(anonymous, "Sleep", b"0")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        wrong = open_channel(svc.address, ClientConfig(auth_token="s3creT"))
        with pytest.raises(grpc.RpcError) as refused:
            call(wrong, "Sleep", b"0")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert call(open_channel(svc.address, ClientConfig(auth_token="s3cret")), "Sleep", b"0") == b"slept"
        # Health probes stay open for orchestrators.
        assert health_pb2_grpc.HealthStub(anonymous).Check(health_pb2.HealthCheckRequest()).status == SERVING


def _certificates(tmp_path: Path) -> dict[str, str]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    files = {
        k: str(tmp_path / f"{k}.pem")
        for k in ("ca", "ca_key", "server", "server_key", "client", "client_key")
    }

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=rollway-test-ca",
        "-keyout",
        files["ca_key"],
        "-out",
        files["ca"],
    )
    ext = tmp_path / "san.cnf"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        csr = str(tmp_path / f"{who}.csr")
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={who}",
            "-keyout",
            files[f"{who}_key"],
            "-out",
            csr,
        )
        run(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            files["ca"],
            "-CAkey",
            files["ca_key"],
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            files[who],
        )
    return files


def test_tls_server_refuses_plaintext_and_mtls_requires_a_client_certificate(tmp_path):
    certs = _certificates(tmp_path)
    tls_client = ClientConfig(tls_ca=certs["ca"], max_retries=0)
    with probe(
        tmp_path, "--tls-cert", certs["server"], "--tls-key", certs["server_key"], client_config=tls_client
    ) as svc:
        with pytest.raises(grpc.RpcError) as refused:
            call(open_channel(svc.address, ClientConfig(max_retries=0)), "Sleep", b"0", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert call(open_channel(svc.address, tls_client), "Sleep", b"0") == b"slept"

    mtls_client = ClientConfig(tls_ca=certs["ca"], tls_cert=certs["client"], tls_key=certs["client_key"])
    args = ["--tls-cert", certs["server"], "--tls-key", certs["server_key"], "--tls-client-ca", certs["ca"]]
    with probe(tmp_path, *args, client_config=mtls_client) as svc:
        with pytest.raises(grpc.RpcError):
            call(open_channel(svc.address, tls_client), "Sleep", b"0", timeout=5)
        assert call(open_channel(svc.address, mtls_client), "Sleep", b"0") == b"slept"


def test_errors_map_to_statuses_without_tracebacks_and_the_service_keeps_serving(tmp_path):
    with probe(tmp_path) as svc:
        channel = open_channel(svc.address)
        with pytest.raises(grpc.RpcError) as invalid:
            call(channel, "Fail", b"invalid")
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert invalid.value.details() == "payload: must not be 'invalid'"
        with pytest.raises(grpc.RpcError) as internal:
            call(channel, "Fail", b"other")
        assert internal.value.code() == grpc.StatusCode.INTERNAL
        assert "Traceback" not in internal.value.details()
        assert "RuntimeError" in internal.value.details()
        assert call(channel, "Sleep", b"0") == b"slept"
        assert "Traceback" in svc.log_text(), "the traceback belongs in the service log"


def test_client_retries_only_idempotent_calls_on_unavailable(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    config = ClientConfig(max_retries=6, retry_backoff_seconds=0.2, timeout_seconds=30)
    channel = open_channel(address, config)
    with pytest.raises(grpc.RpcError) as not_retried:
        call(channel, "Sleep", b"0", timeout=2)
    assert not_retried.value.code() == grpc.StatusCode.UNAVAILABLE

    result: dict = {}

    def check_health():
        try:
            result["status"] = (
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status
            )
        except grpc.RpcError as exc:
            result["error"] = exc.code()

    checker = threading.Thread(target=check_health)
    checker.start()
    time.sleep(0.5)  # the first attempts fail: nothing listens yet
    svc = probe(tmp_path, "--ready-after", "0", wait_serving=False)
    svc.args += ["--port", str(port)]  # the later --port wins over the launcher's --port 0
    with svc:
        checker.join(30)
        assert result.get("error") is None, result
        assert result["status"] in (SERVING, NOT_SERVING)


def test_client_retries_calls_the_server_refused_with_resource_exhausted(tmp_path):
    config = ClientConfig(busy_retries=4, retry_backoff_seconds=0.05, max_retry_backoff_seconds=0.2)
    with probe(tmp_path) as svc:
        channel = open_channel(svc.address, config)
        # Any method (Busy is no idempotent read): a refused call was not processed.
        assert call(channel, "Busy", b"a 3") == b"attempt 4"
        with pytest.raises(grpc.RpcError) as exhausted:  # 5 refusals: 1 call + 4 retries, then give up
            call(channel, "Busy", b"b 5")
        assert exhausted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exhausted.value.details() == "busy: refusing call 5 of b"
        assert call(channel, "Busy", b"b 5") == b"attempt 6"
        with pytest.raises(grpc.RpcError) as told_not_to:  # the server's pushback -1: never retry
            call(channel, "Busy", b"c 1 pushback=-1")
        assert told_not_to.value.details() == "busy: refusing call 1 of c"
        assert call(
            open_channel(svc.address, dataclasses.replace(config, busy_retries=0)), "Busy", b"d 0"
        ) == (b"attempt 1")
        with pytest.raises(grpc.RpcError) as not_retried:
            call(open_channel(svc.address, dataclasses.replace(config, busy_retries=0)), "Busy", b"e 1")
        assert not_retried.value.details() == "busy: refusing call 1 of e"
        # The backoff is bounded: 4 retries at 0.05, 0.1, 0.2, 0.2 s (jittered down to half) at most.
        started = time.monotonic()
        assert call(channel, "Busy", b"f 4") == b"attempt 5"
        assert time.monotonic() - started < 0.55 + 2.0  # + the calls themselves on a busy machine


def test_retrying_stream_restarts_only_a_stream_refused_before_its_first_response(tmp_path):
    config = ClientConfig(busy_retries=4, retry_backoff_seconds=0.05, max_retry_backoff_seconds=0.2)
    with probe(tmp_path) as svc:
        channel = open_channel(svc.address, config)
        busy_stream = channel.unary_stream(f"/{SERVICE}/BusyStream")

        stream = RetryingStream(lambda: busy_stream(b"a 2", timeout=10), config)
        assert list(stream) == [b"attempt 3", b"1", b"2"]
        assert stream.attempts == 3

        plain = busy_stream(b"b 2", timeout=10)  # without the helper the first refusal is final
        with pytest.raises(grpc.RpcError) as refused:
            list(plain)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        broken = RetryingStream(lambda: busy_stream(b"c 0 broken", timeout=10), config)
        received = []
        with pytest.raises(grpc.RpcError) as after_first:
            for response in broken:
                received.append(response)
        assert after_first.value.details() == "busy after the first message"
        assert (received, broken.attempts) == ([b"attempt 1"], 1), "a started stream is never repeated"

        give_up = RetryingStream(lambda: busy_stream(b"d 9", timeout=10), config)
        with pytest.raises(grpc.RpcError) as exhausted:
            list(give_up)
        assert exhausted.value.details() == "busy: refusing call 5 of d"
        assert give_up.attempts == 5

        # cancel() during the backoff ends the retries at once.
        slow = dataclasses.replace(config, retry_backoff_seconds=30.0, max_retry_backoff_seconds=30.0)
        cancelled = RetryingStream(lambda: busy_stream(b"e 9", timeout=10), slow)
        threading.Timer(0.5, cancelled.cancel).start()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError):
            list(cancelled)
        assert time.monotonic() - started < 10 and cancelled.attempts == 1


def test_log_lines_carry_service_rpc_and_run_context(tmp_path):
    with probe(tmp_path) as svc:
        metadata = [
            ("x-rollway-run-id", "run-42"),
            ("x-rollway-step", "7"),
            ("x-rollway-weight-version", "3"),
        ]
        assert call(open_channel(svc.address), "Log", b"hello", metadata=metadata) == b"logged"
        wait_until(lambda: "probe log" in svc.log_text(), 20, "the probe's log line")
        lines = [json.loads(line) for line in svc.log_text().splitlines() if line.startswith("{")]
    event = next(line for line in lines if line.get("event") == "probe log")
    assert event["service"] == "probe"
    assert event["rpc"] == "Log"
    assert (event["run_id"], event["step"], event["weight_version"]) == (
        "run-42",
        7,
        3,
    )  # integers, as in the coordinator's own lines
    assert event["payload"] == "hello"
    assert event["level"] == "info" and "timestamp" in event


def _has_span(path: Path, kind: str, name_end: str) -> bool:
    """A whole line in the trace file at `path` holds a `kind` span whose name ends with `name_end`."""
    lines = path.read_text().split("\n")[:-1] if path.exists() else []  # the last may be half written
    return any(s["kind"] == kind and s["name"].endswith(name_end) for s in map(json.loads, lines))


def test_trace_context_propagates_from_one_service_to_another(tmp_path):
    with (
        probe(tmp_path / "b", env={"ROLLWAY_TRACE_FILE": str(tmp_path / "b.jsonl")}) as callee,
        probe(
            tmp_path / "a",
            "--relay-to",
            callee.address,
            env={"ROLLWAY_TRACE_FILE": str(tmp_path / "a.jsonl")},
        ) as caller,
    ):
        assert call(open_channel(caller.address), "Relay") == b"SERVING"
        wait_until(lambda: _has_span(tmp_path / "a.jsonl", "SERVER", "/Relay"), 20, "the caller's Relay span")
        wait_until(lambda: _has_span(tmp_path / "b.jsonl", "SERVER", "/Check"), 20, "the callee's Check span")
    spans_a = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    spans_b = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines()]
    relay_server = next(s for s in spans_a if s["kind"] == "SERVER" and s["name"].endswith("/Relay"))
    check_client = next(s for s in spans_a if s["kind"] == "CLIENT" and s["name"].endswith("/Check"))
    assert check_client["parent_span_id"] == relay_server["span_id"]
    # The callee also answered the launcher's health probes: those are roots of other traces.
    check_server = [s for s in spans_b if s["kind"] == "SERVER" and s["trace_id"] == relay_server["trace_id"]]
    assert len(check_server) == 1 and check_server[0]["name"].endswith("/Check")
    check_server = check_server[0]
    assert check_server["parent_span_id"] == check_client["span_id"]
    assert (relay_server["service"], check_server["service"]) == ("rollway-probe", "rollway-probe")
