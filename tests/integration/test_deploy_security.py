"""Security settings a deployment sets through the environment (deploy/README.md, "Ports and
security"): ROLLWAY_AUTH_TOKEN on every process, ROLLWAY_TLS_CA (+ _CERT/_KEY) on every client."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from support.processes import ServiceProcess

from rollway.common.client import ClientConfig, open_channel
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc

TOKEN = "compose-token-123"


def certificates(tmp_path: Path) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 and the compose name `dataloader`."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (it makes the test certificates)")
    files = {k: str(tmp_path / f"{k}.pem") for k in ("ca", "ca_key", "server", "server_key", "csr")}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rollway-ca",
        "-keyout", files["ca_key"], "-out", files["ca"])  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=dataloader",
        "-keyout", files["server_key"], "-out", files["csr"])  # fmt: skip
    extensions = tmp_path / "san.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:dataloader\n")
    run("x509", "-req", "-in", files["csr"], "-CA", files["ca"], "-CAkey", files["ca_key"], "-CAcreateserial",
        "-days", "2", "-extfile", str(extensions), "-out", files["server"])  # fmt: skip
    return files


def healthcheck(address: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLWAY_TLS_", "ROLLWAY_AUTH"))}
    return subprocess.run(
        [sys.executable, "-m", "rollway.common.healthcheck", address, "--timeout", "3"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_and_tls_from_the_environment(tmp_path, tiny_model_dir, demo_data_dir):
    certs = certificates(tmp_path)
    args = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(demo_data_dir / "rl.parquet"),
            "--input-key", "prompt", "--tls-cert", certs["server"], "--tls-key", certs["server_key"]]  # fmt: skip
    tls = ClientConfig(tls_ca=certs["ca"], auth_token=TOKEN, max_retries=0)
    with ServiceProcess(
        "dataloader", args, tmp_path, env={"ROLLWAY_AUTH_TOKEN": TOKEN}, client_config=tls
    ) as dataloader:
        # Health checks need neither the token (exempt) nor flags: the CA comes from the environment.
        ok = healthcheck(dataloader.address, ROLLWAY_TLS_CA=certs["ca"])
        assert (ok.returncode, ok.stdout.strip()) == (0, f"{dataloader.address}: SERVING")
        by_name = healthcheck(
            dataloader.address, ROLLWAY_TLS_CA=certs["ca"], ROLLWAY_TLS_SERVER_NAME="dataloader"
        )
        assert by_name.returncode == 0, by_name.stdout
        plaintext = healthcheck(dataloader.address)
        assert plaintext.returncode == 1 and "UNAVAILABLE" in plaintext.stdout

        describe = dataloader_pb2.DescribeRequest()
        os.environ["ROLLWAY_TLS_CA"] = certs["ca"]  # what compose sets for a client process
        try:
            without_token = dataloader_pb2_grpc.DataloaderServiceStub(
                open_channel(dataloader.address, ClientConfig(max_retries=0))
            )
            with pytest.raises(grpc.RpcError) as refused:
                without_token.Describe(describe)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with_token = dataloader_pb2_grpc.DataloaderServiceStub(
                open_channel(dataloader.address, ClientConfig(auth_token=TOKEN))
            )
            assert with_token.Describe(describe).mode == "rl"
        finally:
            del os.environ["ROLLWAY_TLS_CA"]
