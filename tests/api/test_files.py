"""Files over real HTTP (docs/files.md): multipart uploads to a real server, types read from the bytes,
refusals that store nothing (413 and 415), per-principal isolation, dedupe, the bytes served back in
parts with safe headers, paging, deletion, and 405 for a wrong method (not a refusal of the body)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import sqlite3
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from PIL import Image

from app.api.files import router
from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

ELF = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def image(kind: str = "PNG", size: tuple[int, int] = (7, 5), color: str = "red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, kind)
    return buffer.getvalue()


def db_path(settings: Settings) -> str:
    return settings.database_url.split("///", 1)[1]


def counts(settings: Settings) -> tuple[int, int]:
    """(files, blob parts) in the server's database, read beside it."""
    with sqlite3.connect(db_path(settings)) as connection:
        files = connection.execute("SELECT count(*) FROM files").fetchone()[0]
        parts = connection.execute("SELECT count(*) FROM file_chunks").fetchone()[0]
    return int(files), int(parts)


async def upload(
    client: httpx.AsyncClient, name: str, data: bytes, media_type: str = "application/octet-stream"
) -> httpx.Response:
    return await client.post("/v1/files", files={"file": (name, data, media_type)})


@pytest.fixture
def keyed(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": f"alice:{ALICE},bob:{BOB}", "files_chunk_bytes": 4096})


@pytest.fixture
def server(keyed: Settings) -> Iterator[LiveServer]:
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


@pytest.mark.parametrize(
    ("name", "data", "declared", "media_type"),
    [
        ("shot.png", image("PNG"), "image/png", "image/png"),
        # The declared type and the name are not what decides: the bytes are.
        ("photo.bin", image("JPEG"), "application/octet-stream", "image/jpeg"),
        ("anim.gif", image("GIF"), "image/gif", "image/gif"),
        ("pic.webp", image("WEBP"), "image/webp", "image/webp"),
        ("paper.pdf", PDF, "application/pdf", "application/pdf"),
        ("notes.txt", "héllo, wörld\n".encode(), "text/plain", "text/plain"),
        ("README.md", b"# Title\n\n- item\n", "application/octet-stream", "text/markdown"),
        ("table.csv", b"a,b\n1,2\n", "text/csv", "text/csv"),
        ("data.json", b'{"a": [1, 2]}', "application/json", "application/json"),
        ("pasted", b"plain words", "text/plain", "text/plain"),
    ],
)
async def test_an_upload_is_typed_by_its_bytes(
    alice: httpx.AsyncClient, name: str, data: bytes, declared: str, media_type: str
) -> None:
    answer = await upload(alice, name, data, declared)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["media_type"] == media_type
    assert body["size"] == len(data)
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["id"].startswith("f_")
    if media_type.startswith("image/"):
        assert (body["width"], body["height"]) == (7, 5)
    else:
        assert body["width"] is None and body["height"] is None
    assert (await alice.get(f"/v1/files/{body['id']}")).json() == body


@pytest.mark.parametrize(
    ("name", "data", "declared"),
    [
        ("innocent.png", ELF, "image/png"),  # an executable named and declared as an image
        ("script.txt", ELF, "text/plain"),  # not UTF-8: not text, whatever it says
        ("page.html", b"<html><script>alert(1)</script></html>", "text/html"),
        ("nul.txt", b"text\x00with a NUL", "text/plain"),
        ("broken.png", b"\x89PNG\r\n\x1a\n" + b"not an image at all", "image/png"),
    ],
)
async def test_what_the_bytes_do_not_show_as_allowed_is_415_and_stores_nothing(
    alice: httpx.AsyncClient, keyed: Settings, name: str, data: bytes, declared: str
) -> None:
    answer = await upload(alice, name, data, declared)
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert counts(keyed) == (0, 0)


async def test_allowed_types_are_a_setting(settings: Settings) -> None:
    only_text = settings.model_copy(update={"files_allowed_types": "text/plain"})
    with live_server(only_text) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as client:
            assert (await upload(client, "a.png", image())).status_code == 415
            assert (await upload(client, "a.txt", b"fine")).status_code == 201


async def test_too_large_is_413_while_streaming_and_stores_nothing(settings: Settings) -> None:
    small = settings.model_copy(update={"files_max_bytes": 10_000, "files_chunk_bytes": 4096})
    with live_server(small) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as client:
            # With a Content-Length past the limit: refused before the body is read.
            answer = await upload(client, "big.txt", b"x" * 200_000)
            assert answer.status_code == 413, answer.text
            assert answer.json()["error"]["code"] == "payload_too_large"
            # Within the multipart allowance but past the file limit: counted as it streams in.
            answer = await upload(client, "big.txt", b"x" * 10_001)
            assert answer.status_code == 413, answer.text

            # Chunked, with no Content-Length at all: counted as it streams in.
            async def chunked() -> AsyncIterator[bytes]:
                yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
                for _ in range(20):
                    yield b"y" * 1000
                yield b"\r\n--b--\r\n"

            answer = await client.post(
                "/v1/files", content=chunked(), headers={"content-type": "multipart/form-data; boundary=b"}
            )
            assert answer.status_code == 413, answer.text
            # Exactly at the limit: taken.
            assert (await upload(client, "ok.txt", b"z" * 10_000)).status_code == 201
        assert counts(small) == (1, 3)


@pytest.mark.parametrize(
    ("content_type", "body", "status"),
    [
        ("application/json", b'{"file": "x"}', 415),
        (
            "multipart/form-data; boundary=b",
            b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nx\r\n--b--\r\n',
            422,
        ),
        (
            "multipart/form-data; boundary=b",
            b'--b\r\nContent-Disposition: form-data; name="other"\r\n\r\nx\r\n--b--\r\n',
            422,
        ),
        ("multipart/form-data; boundary=b", b"--b\r\nnot multipart at all", 422),
    ],
)
async def test_a_body_that_is_not_an_upload_is_refused(
    alice: httpx.AsyncClient, keyed: Settings, content_type: str, body: bytes, status: int
) -> None:
    answer = await alice.post("/v1/files", content=body, headers={"content-type": content_type})
    assert answer.status_code == status, answer.text
    assert counts(keyed) == (0, 0)


async def test_an_empty_file_is_422(alice: httpx.AsyncClient) -> None:
    answer = await upload(alice, "empty.txt", b"")
    assert answer.status_code == 422, answer.text


async def test_purpose_is_taken(alice: httpx.AsyncClient) -> None:
    answer = await alice.post(
        "/v1/files", files={"file": ("a.txt", b"hi", "text/plain")}, data={"purpose": "attachment"}
    )
    assert answer.status_code == 201, answer.text


async def test_the_same_bytes_are_stored_once(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient, keyed: Settings
) -> None:
    data = image(size=(300, 200))  # several parts of 4096 bytes
    first = (await upload(alice, "a.png", data)).json()
    again = await upload(alice, "b.png", data)
    assert again.status_code == 201
    assert again.json()["id"] == first["id"]
    parts = counts(keyed)[1]
    assert counts(keyed) == (1, parts) and parts == -(-len(data) // 4096)
    # Another principal's upload of the same bytes is its own file; the blob is shared.
    theirs = (await upload(bob, "c.png", data)).json()
    assert theirs["id"] != first["id"]
    assert counts(keyed) == (2, parts)


async def test_racing_uploads_of_the_same_bytes_make_one_file(
    alice: httpx.AsyncClient, keyed: Settings
) -> None:
    data = image(size=(120, 90), color="blue")
    answers = await asyncio.gather(*(upload(alice, f"{n}.png", data) for n in range(6)))
    assert {a.status_code for a in answers} == {201}
    assert len({a.json()["id"] for a in answers}) == 1
    assert counts(keyed)[0] == 1


async def test_another_principal_gets_404_everywhere(
    alice: httpx.AsyncClient, bob: httpx.AsyncClient
) -> None:
    file_id = (await upload(alice, "secret.txt", b"alice only")).json()["id"]
    for answer in (
        await bob.get(f"/v1/files/{file_id}"),
        await bob.get(f"/v1/files/{file_id}/content"),
        await bob.delete(f"/v1/files/{file_id}"),
    ):
        assert answer.status_code == 404, answer.text
    assert (await bob.get("/v1/files")).json()["files"] == []
    session = (await bob.post("/v1/sessions", json={})).json()["id"]
    posted = await bob.post(
        f"/v1/sessions/{session}/messages", json={"content": "look", "attachments": [{"file_id": file_id}]}
    )
    assert posted.status_code == 404, posted.text
    assert (await alice.get(f"/v1/files/{file_id}")).status_code == 200


async def test_content_is_served_in_parts_with_safe_headers(alice: httpx.AsyncClient) -> None:
    data = image(size=(400, 300), color="green")
    created = (await upload(alice, "Grüße 1.png", data)).json()
    async with alice.stream("GET", f"/v1/files/{created['id']}/content") as answer:
        assert answer.status_code == 200
        received = [chunk async for chunk in answer.aiter_raw()]
        headers = answer.headers
    assert b"".join(received) == data
    assert headers["content-type"] == "image/png"
    assert headers["content-length"] == str(len(data))
    assert headers["x-content-type-options"] == "nosniff"
    assert (
        headers["content-disposition"]
        == "inline; filename=\"Gr__e 1.png\"; filename*=UTF-8''Gr%C3%BC%C3%9Fe%201.png"
    )
    text = (await upload(alice, "a.md", b"# hi")).json()
    served = await alice.get(f"/v1/files/{text['id']}/content")
    assert served.headers["content-type"] == "text/markdown; charset=utf-8"
    assert served.headers["content-disposition"].startswith("attachment;")
    assert served.content == b"# hi"


def noise(size: tuple[int, int] = (100, 60)) -> bytes:
    """A PNG of random pixels: it does not compress, so it spans several stored parts."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", size, random.Random(size[0]).randbytes(size[0] * size[1] * 3)).save(buffer, "PNG")
    return buffer.getvalue()


async def assert_ranges_are_served(client: httpx.AsyncClient, file_id: str, data: bytes) -> None:
    """`Range` answered with 206 and exactly those bytes (across stored parts), ignored when it is several
    ranges or malformed (200, the whole file), and 416 when it starts past the end."""
    size = len(data)
    url = f"/v1/files/{file_id}/content"
    for header, first, last in [
        ("bytes=0-0", 0, 0),
        ("bytes=4000-8999", 4000, 8999),
        ("bytes=10000-", 10000, size - 1),
        ("bytes=-100", size - 100, size - 1),
        (f"bytes=5-{size + 1000}", 5, size - 1),
        (f"bytes=-{size + 5}", 0, size - 1),
    ]:
        answer = await client.get(url, headers={"Range": header})
        assert answer.status_code == 206, (header, answer.text)
        assert answer.content == data[first : last + 1], header
        assert answer.headers["content-range"] == f"bytes {first}-{last}/{size}"
        assert answer.headers["content-length"] == str(last - first + 1)
    for ignored in ["bytes=0-1,5-9", "items=0-5", "bytes=9-3", "bytes=x-"]:
        whole = await client.get(url, headers={"Range": ignored})
        assert (whole.status_code, whole.content) == (200, data), ignored
        assert whole.headers["accept-ranges"] == "bytes"
    for past in [f"bytes={size}-", "bytes=-0"]:
        refused = await client.get(url, headers={"Range": past})
        assert refused.status_code == 416, past
        assert refused.json()["error"]["code"] == "range_not_satisfiable"
        assert refused.headers["content-range"] == f"bytes */{size}"


async def test_a_range_is_served_as_206_from_the_parts_that_hold_it(alice: httpx.AsyncClient) -> None:
    data = noise()
    assert len(data) > 4 * 4096  # parts of 4096 bytes (keyed)
    created = (await upload(alice, "noise.png", data)).json()
    await assert_ranges_are_served(alice, created["id"], data)


async def test_the_list_pages_newest_first(alice: httpx.AsyncClient, bob: httpx.AsyncClient) -> None:
    made = [(await upload(alice, f"{n}.txt", f"file {n}".encode())).json()["id"] for n in range(5)]
    await upload(bob, "b.txt", b"not alice's")
    seen: list[str] = []
    after = None
    while True:
        page = (
            await alice.get("/v1/files", params={"limit": 2, **({"after": after} if after else {})})
        ).json()
        seen += [f["id"] for f in page["files"]]
        after = page["next_cursor"]
        if after is None:
            break
    assert seen == made[::-1]
    unknown = await alice.get("/v1/files", params={"after": "f_0000000000000000"})
    assert unknown.status_code == 422


async def test_delete_removes_the_file_and_its_blob(alice: httpx.AsyncClient, keyed: Settings) -> None:
    file_id = (await upload(alice, "a.txt", b"short-lived")).json()["id"]
    assert (await alice.delete(f"/v1/files/{file_id}")).status_code == 204
    assert (await alice.get(f"/v1/files/{file_id}")).status_code == 404
    assert (await alice.delete(f"/v1/files/{file_id}")).status_code == 404
    assert counts(keyed) == (0, 0)


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/files", "multipart/form-data; boundary=b"),
        ("/v1/files", "text/plain"),
        ("/v1/files/f_0123456789abcdef", "image/png"),
    ],
)
async def test_a_wrong_method_is_405_whatever_the_body(
    alice: httpx.AsyncClient, method: str, path: str, content_type: str
) -> None:
    answer = await alice.request(method, path, content=b"--b--\r\n", headers={"content-type": content_type})
    assert answer.status_code == 405, answer.text


async def test_an_upload_without_a_key_is_401_before_its_body_is_read(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        answer = await upload(client, "a.txt", b"hello")
    assert answer.status_code == 401


def test_the_upload_route_reads_its_body_itself() -> None:
    """FastAPI reads (and spools whole) a body its route declares; this one declares none, so the bytes
    reach the files service as they stream in, counted against the limit."""
    [upload_route] = [r for r in router.routes if getattr(r, "methods", None) == {"POST"}]
    assert getattr(upload_route, "body_field", None) is None
