"""Files' bytes in an S3-compatible object store (docs/files.md, Storage): PARLEY_FILES_URL=s3://bucket/prefix
with the standard AWS variables. One object per blob, named `<prefix>/<sha256>`; each request signed with
Signature Version 4 (app.storage.sigv4) and sent with httpx: a PUT whose payload hash is the key itself
(the server checks the bytes against it), a ranged GET streamed to the client as it arrives, a DELETE once
no file row holds the blob.

Where the server is: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (MinIO, Ceph, R2, a test server; addressed by
path, `<endpoint>/<bucket>/<key>`), else AWS itself in AWS_REGION (or AWS_DEFAULT_REGION, else us-east-1),
addressed by virtual host (`https://<bucket>.s3.<region>.amazonaws.com/<key>`).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO
from urllib.parse import urlsplit

import httpx

from app.errors import StorageFailed, StorageOutOfReach
from app.storage.engine import Database
from app.storage.files import unheld_blobs
from app.storage.sigv4 import EMPTY_SHA256, Credentials, sign

URL_PATTERN = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?$")
# Bytes of the body sent per write, and of a served file per read from the server's answer.
PART_BYTES = 256 * 1024
TIMEOUT = httpx.Timeout(30.0, connect=5.0)
RETRY_AFTER = 2


@dataclass(frozen=True)
class S3Location:
    """A bucket and a prefix, the server that holds them and the credentials to sign with."""

    bucket: str
    prefix: str
    endpoint: str
    region: str
    credentials: Credentials
    path_style: bool

    @classmethod
    def from_env(cls, url: str, env: Mapping[str, str] | None = None) -> S3Location:
        """From PARLEY_FILES_URL and the AWS variables; ValueError (saying which) when they cannot be used."""
        env = os.environ if env is None else env
        found = URL_PATTERN.match(url)
        if found is None:
            raise ValueError("PARLEY_FILES_URL must be s3://bucket or s3://bucket/prefix")
        access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            raise ValueError(
                "PARLEY_FILES_URL names an S3 bucket: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
        bucket = found["bucket"]
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ValueError("AWS_ENDPOINT_URL must be an http:// or https:// URL")
        return cls(
            bucket=bucket,
            prefix=(found["prefix"] or "").strip("/"),
            endpoint=endpoint.rstrip("/") or f"https://{bucket}.s3.{region}.amazonaws.com",
            region=region,
            credentials=Credentials(access, secret, env.get("AWS_SESSION_TOKEN") or None),
            path_style=bool(endpoint),
        )

    def path(self, sha256: str) -> str:
        key = f"{self.prefix}/{sha256}" if self.prefix else sha256
        return f"/{self.bucket}/{key}" if self.path_style else f"/{key}"


class ObjectStoreBlobs:
    """The blob seam (app.storage.blobs.Blobs) over an S3-compatible server."""

    def __init__(self, location: S3Location, database: Database) -> None:
        self._location = location
        self._database = database
        self._client = httpx.AsyncClient(timeout=TIMEOUT)
        split = urlsplit(location.endpoint)
        self._host = split.netloc
        self._base = f"{split.scheme}://{split.netloc}{split.path.rstrip('/')}"
        self._base_path = split.path.rstrip("/")

    def _request(
        self, method: str, sha256: str, headers: dict[str, str] | None = None, payload: str = EMPTY_SHA256
    ) -> tuple[str, dict[str, str]]:
        path = self._base_path + self._location.path(sha256)
        signed = sign(
            method,
            self._host,
            path,
            {},
            headers or {},
            payload,
            self._location.credentials,
            self._location.region,
            datetime.now(UTC),
        )
        return self._base + self._location.path(sha256), signed

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            return await self._client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise StorageOutOfReach(
                "The file store is out of reach; try again shortly.", retry_after=RETRY_AFTER
            ) from exc

    @staticmethod
    def _failed(response: httpx.Response, doing: str) -> StorageFailed:
        return StorageFailed(
            f"The file store refused to {doing} (HTTP {response.status_code}).", retry_after=RETRY_AFTER
        )

    async def has(self, sha256: str) -> bool:
        url, headers = self._request("HEAD", sha256)
        response = await self._send(self._client.build_request("HEAD", url, headers=headers))
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            raise self._failed(response, "say whether it holds a file")
        return True

    async def put(self, sha256: str, size: int, spool: IO[bytes]) -> None:
        if await self.has(sha256):
            return

        async def body() -> AsyncIterator[bytes]:
            while data := spool.read(PART_BYTES):
                yield data

        # The payload's hash is the key: a server that received other bytes refuses them (400).
        url, headers = self._request("PUT", sha256, {"content-length": str(size)}, payload=sha256)
        request = self._client.build_request("PUT", url, headers=headers, content=body())
        response = await self._send(request)
        if response.status_code != 200:
            raise self._failed(response, "store a file")

    async def read(self, sha256: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        if end is not None and end <= start:
            return
        wanted = {"range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end else {}
        url, headers = self._request("GET", sha256, wanted)
        response = await self._send(self._client.build_request("GET", url, headers=headers), stream=True)
        try:
            if response.status_code in (404, 416):
                return
            if response.status_code not in (200, 206):
                raise self._failed(response, "read a file")
            try:
                async for data in response.aiter_bytes(PART_BYTES):
                    yield data
            except httpx.HTTPError as exc:
                raise StorageOutOfReach(
                    "The file store stopped answering; try again shortly.", retry_after=RETRY_AFTER
                ) from exc
        finally:
            await response.aclose()

    async def forget(self, sha256s: Iterable[str]) -> None:
        wanted = sorted(set(sha256s))
        if not wanted:
            return
        async with self._database.read() as db:
            gone = await unheld_blobs(db, wanted)
        for sha256 in gone:
            url, headers = self._request("DELETE", sha256)
            response = await self._send(self._client.build_request("DELETE", url, headers=headers))
            if response.status_code not in (200, 204, 404):
                raise self._failed(response, "delete a file")

    async def close(self) -> None:
        await self._client.aclose()
