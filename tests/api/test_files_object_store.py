"""Files kept in an S3-compatible object store (PARLEY_FILES_URL=s3://bucket/prefix, docs/files.md) over real
HTTP, against a real server that checks every signature (tests/support/s3.py): an upload lands in the
bucket under its hash and nothing in the database's blob table, the same bytes are one object whoever
uploads them, the bytes are served back from the bucket (ranges too), the demo model receives them, and
the object goes with the last file that holds it (a deleted session's, then a deleted file's)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from app.settings import Settings
from tests.api.test_files import ALICE, BOB, assert_ranges_are_served, counts, image, noise, upload
from tests.support.s3 import S3Server, s3_server
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

__all__ = ["s3_server"]


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    name = f"parley-{secrets.token_hex(4)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def server(
    settings: Settings, s3_server: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveServer]:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    keyed = settings.model_copy(
        update={"api_keys": f"alice:{ALICE},bob:{BOB}", "files_url": f"s3://{bucket}/uploads"}
    )
    with live_server(keyed) as running:
        yield running


@pytest.fixture
async def alice(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture
async def bob(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {BOB}"}
    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=30) as client:
        yield client


async def test_files_live_in_the_bucket_from_upload_to_the_last_deletion(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient, s3_server: S3Server, bucket: str, settings: Settings
) -> None:
    png = image(size=(300, 200), color="blue")
    uploaded = await upload(alice, "shot.png", png, "image/png")
    assert uploaded.status_code == 201, uploaded.text
    file = uploaded.json()
    key = f"uploads/{file['sha256']}"
    assert s3_server.keys(bucket) == [key]
    assert counts(settings) == (1, 0)  # a row for the file, no part of it in the database

    again = await upload(alice, "again.png", png, "image/png")
    theirs = await upload(bob, "bobs.png", png, "image/png")
    assert again.json()["id"] == file["id"]
    assert theirs.json()["id"] != file["id"]
    assert s3_server.keys(bucket) == [key]  # one object for both principals' files

    served = await alice.get(f"/v1/files/{file['id']}/content")
    assert served.status_code == 200
    assert served.content == png
    assert served.headers["content-type"] == "image/png"
    assert served.headers["content-length"] == str(len(png))
    big = noise()
    await assert_ranges_are_served(alice, (await upload(alice, "noise.png", big)).json()["id"], big)
    assert len(s3_server.keys(bucket)) == 2

    session = (await alice.post("/v1/sessions", json={})).json()["id"]
    sent = await alice.post(
        f"/v1/sessions/{session}/messages?wait=true",
        json={"content": "What is this?", "attachments": [{"file_id": file["id"]}]},
    )
    assert sent.status_code == 200, sent.text
    assert f"shot.png (image/png, {len(png)} bytes, 300x200 pixels)" in sent.json()["final_answer"]
    assert (await alice.delete(f"/v1/files/{file['id']}")).status_code == 409

    assert (await alice.delete(f"/v1/sessions/{session}")).status_code == 204
    assert (await alice.get(f"/v1/files/{file['id']}")).status_code == 404
    assert key in s3_server.keys(bucket)  # bob's file holds it
    assert (await bob.delete(f"/v1/files/{theirs.json()['id']}")).status_code == 204
    assert key not in s3_server.keys(bucket)
    assert counts(settings) == (1, 0)  # the noise
