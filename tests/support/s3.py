"""A real S3-compatible server for the object store's tests: moto's `moto_server` (PyPI `moto[server]`) on a
free port, with authentication on, so every request must carry a valid Signature Version 4: its first three
requests (unsigned) make an IAM user, its access key and a policy that lets it use S3; everything after
that is signed with that key, and a wrong signature is a 403 SignatureDoesNotMatch.

The server is looked for beside the test's Python (the dev lock installs it), then on the PATH (or at
PARLEY_TEST_S3_SERVER); where there is none the tests skip with one line, and fail under CI=true.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from app.storage.sigv4 import EMPTY_SHA256, Credentials, sign
from tests.support.missing import missing
from tests.support.server import free_port

REGION = "us-east-1"
_POLICY = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}'
# moto reads the service from an Authorization header's scope, even on the requests it does not check.
_IAM_SCOPE = (
    "AWS4-HMAC-SHA256 Credential=setup/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0"
)


def server_binary() -> str | None:
    given = os.environ.get("PARLEY_TEST_S3_SERVER")
    if given:
        return given
    beside = Path(sys.executable).parent / "moto_server"
    if beside.exists():
        return str(beside)
    return shutil.which("moto_server")


@dataclass
class S3Server:
    endpoint: str
    credentials: Credentials
    process: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return self.endpoint.removeprefix("http://")

    def env(self) -> dict[str, str]:
        """The AWS variables a Parley server needs to use this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def request(
        self, method: str, path: str, *, credentials: Credentials | None = None, content: bytes = b""
    ) -> httpx.Response:
        """A request signed as Parley signs its own (app.storage.sigv4), by default with the server's key."""
        payload = hashlib.sha256(content).hexdigest() if content else EMPTY_SHA256
        headers = sign(
            method,
            self.host,
            path,
            {},
            {},
            payload,
            credentials or self.credentials,
            REGION,
            datetime.now(UTC),
        )
        return httpx.request(method, self.endpoint + path, headers=headers, content=content, timeout=10)

    def create_bucket(self, bucket: str) -> None:
        response = self.request("PUT", f"/{bucket}")
        assert response.status_code == 200, response.text

    def keys(self, bucket: str) -> list[str]:
        """Every object's key in `bucket` (ListObjectsV2, one page: the tests store a few)."""
        response = self.request("GET", f"/{bucket}")
        assert response.status_code == 200, response.text
        return re.findall(r"<Key>(.*?)</Key>", response.text)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    binary = server_binary()
    if binary is None:
        missing("no S3-compatible server: moto[server] (its moto_server) runs the object store's tests")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("s3") / "moto.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [binary, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {process.returncode}:\n{log_path.read_text()}")
            try:
                httpx.get(f"{endpoint}/moto-api/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        def iam(**params: str) -> str:
            response = httpx.post(
                endpoint,
                data={**params, "Version": "2010-05-08"},
                headers={"Authorization": _IAM_SCOPE},
                timeout=10,
            )
            assert response.status_code == 200, response.text
            return response.text

        iam(Action="CreateUser", UserName="parley")
        made = iam(Action="CreateAccessKey", UserName="parley")
        iam(Action="PutUserPolicy", UserName="parley", PolicyName="s3", PolicyDocument=_POLICY)
        access = re.search(r"<AccessKeyId>(.*?)</AccessKeyId>", made)
        secret = re.search(r"<SecretAccessKey>(.*?)</SecretAccessKey>", made)
        assert access is not None and secret is not None
        yield S3Server(endpoint, Credentials(access[1], secret[1]), process)
    finally:
        process.terminate()
        process.wait(timeout=10)
