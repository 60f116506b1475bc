"""app.storage.object_store against a real S3-compatible server that checks every signature (moto's server,
tests/support/s3.py): bytes stored under `<prefix>/<sha256>` and read back whole or by range, streamed in
parts; the same bytes stored once; a blob deleted only when no file row holds it; a refused signature and a
server out of reach as the storage errors a client is told to retry; and the configuration read from
PARLEY_FILES_URL and the AWS variables."""

from __future__ import annotations

import hashlib
import io
import secrets
from collections.abc import AsyncIterator

import pytest

from app.errors import StorageFailed, StorageOutOfReach
from app.storage import files
from app.storage.engine import Database
from app.storage.object_store import PART_BYTES, ObjectStoreBlobs, S3Location
from app.storage.sigv4 import Credentials
from app.storage.tables import FileRow
from tests.support.s3 import S3Server, s3_server
from tests.support.server import free_port

pytestmark = pytest.mark.anyio

DATA = secrets.token_bytes(PART_BYTES * 2 + 1234)
SHA = hashlib.sha256(DATA).hexdigest()

__all__ = ["s3_server"]


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"parley-{secrets.token_hex(4)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    yield db
    await db.dispose()


@pytest.fixture
async def blobs(s3_server: S3Server, bucket: str, database: Database) -> AsyncIterator[ObjectStoreBlobs]:
    store = ObjectStoreBlobs(S3Location.from_env(f"s3://{bucket}/parley/files", s3_server.env()), database)
    yield store
    await store.close()


async def read(blobs: ObjectStoreBlobs, sha256: str, start: int = 0, end: int | None = None) -> list[bytes]:
    return [part async for part in blobs.read(sha256, start, end)]


async def test_bytes_are_stored_under_their_hash_and_streamed_back_in_parts(
    blobs: ObjectStoreBlobs, s3_server: S3Server, bucket: str
) -> None:
    await blobs.put(SHA, len(DATA), io.BytesIO(DATA))
    assert s3_server.keys(bucket) == [f"parley/files/{SHA}"]
    parts = await read(blobs, SHA)
    assert b"".join(parts) == DATA
    assert len(parts) >= 3 and max(len(p) for p in parts) <= PART_BYTES  # never one buffer of the whole


@pytest.mark.parametrize(("start", "end"), [(0, 1), (10, 20), (PART_BYTES - 1, PART_BYTES + 1), (5000, None)])
async def test_a_range_is_read_from_the_server(blobs: ObjectStoreBlobs, start: int, end: int | None) -> None:
    await blobs.put(SHA, len(DATA), io.BytesIO(DATA))
    assert b"".join(await read(blobs, SHA, start, end)) == DATA[start:end]


async def test_the_same_bytes_are_stored_once_and_an_absent_blob_reads_as_nothing(
    blobs: ObjectStoreBlobs, s3_server: S3Server, bucket: str
) -> None:
    await blobs.put(SHA, len(DATA), io.BytesIO(DATA))
    await blobs.put(SHA, len(DATA), io.BytesIO(b""))  # there already: nothing is read or sent
    assert s3_server.keys(bucket) == [f"parley/files/{SHA}"]
    assert await read(blobs, "0" * 64) == []


async def test_a_blob_is_deleted_only_once_no_file_holds_it(
    blobs: ObjectStoreBlobs, database: Database, s3_server: S3Server, bucket: str
) -> None:
    await blobs.put(SHA, len(DATA), io.BytesIO(DATA))
    row = FileRow(
        id="f_0123456789abcdef",
        principal="alice",
        name="x.bin",
        media_type="application/pdf",
        size=len(DATA),
        sha256=SHA,
        created_at="2026-11-29T04:00:00.000+00:00",
    )
    async with database.session() as db:
        await files.insert_file(db, row)
        await db.commit()
    await blobs.forget([SHA])
    assert s3_server.keys(bucket) == [f"parley/files/{SHA}"]
    async with database.session() as db:
        freed = await files.delete_files(db, [row])
        await db.commit()
    await blobs.forget(freed)
    assert s3_server.keys(bucket) == []


async def test_a_wrong_secret_is_refused_by_the_server_as_a_storage_error(
    s3_server: S3Server, bucket: str, database: Database
) -> None:
    wrong = {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    store = ObjectStoreBlobs(S3Location.from_env(f"s3://{bucket}", wrong), database)
    try:
        with pytest.raises(StorageFailed, match="HTTP 403"):
            await store.put(SHA, len(DATA), io.BytesIO(DATA))
    finally:
        await store.close()
    assert s3_server.request("PUT", f"/{bucket}/x", credentials=Credentials("x", "y")).status_code == 403


async def test_a_server_out_of_reach_is_storage_unavailable(database: Database) -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
    }
    store = ObjectStoreBlobs(S3Location.from_env("s3://bucket", env), database)
    try:
        with pytest.raises(StorageOutOfReach) as caught:
            await read(store, SHA)
    finally:
        await store.close()
    assert caught.value.retry_after == 2


def test_the_location_comes_from_the_url_and_the_aws_variables() -> None:
    keys = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}
    aws = S3Location.from_env("s3://my-bucket/a/b/", {**keys, "AWS_DEFAULT_REGION": "eu-west-3"})
    assert (aws.endpoint, aws.region, aws.prefix, aws.path_style) == (
        "https://my-bucket.s3.eu-west-3.amazonaws.com",
        "eu-west-3",
        "a/b",
        False,
    )
    assert aws.path("ab" * 32) == "/a/b/" + "ab" * 32
    other = S3Location.from_env(
        "s3://my-bucket",
        {**keys, "AWS_REGION": "auto", "AWS_DEFAULT_REGION": "x", "AWS_ENDPOINT_URL": "https://s3.example/"},
    )
    assert (other.endpoint, other.region, other.path("cd" * 32)) == (
        "https://s3.example",
        "auto",
        "/my-bucket/" + "cd" * 32,
    )
    assert (
        S3Location.from_env("s3://my-bucket", {**keys, "AWS_SESSION_TOKEN": "t"}).credentials.session_token
        == "t"
    )
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID"):
        S3Location.from_env("s3://my-bucket", {})
    with pytest.raises(ValueError, match="s3://bucket"):
        S3Location.from_env("https://my-bucket", keys)
