"""The stream's bytes as a shell script sees them (issue 31): every line ends in LF, never CRLF, so that
`grep '^id:'` gives an id without a trailing CR (sent back in a header, a bare CR makes the HTTP parser,
httptools or h11 alike, refuse the whole request with its plain-text 400, as RFC 9112 allows, before
the app sees it); and a Last-Event-ID with blanks around it resumes after that id, while one that is not
a position is a JSON 422. Over a real socket, the header exactly as written."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.support.client import new_session
from tests.support.server import LiveServer

pytestmark = pytest.mark.anyio

SAFETY = 30.0


async def _a_finished_turn(client: httpx.AsyncClient) -> str:
    sid = await new_session(client)
    response = await client.post(f"/v1/sessions/{sid}/messages?wait=true", json={"content": "hello"})
    assert response.status_code == 200 and response.json()["status"] == "completed", response.text
    return sid


def _raw_get(server: LiveServer, path: str, headers: bytes) -> tuple[str, dict[str, str], bytes]:
    """The status line, headers and (unchunked) body of one request sent byte for byte."""
    request = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers
    with socket.create_connection(("127.0.0.1", server.port), timeout=SAFETY) as sock:
        sock.sendall(request + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in lines)
    if fields.get("transfer-encoding") == "chunked":
        body = _unchunked(body)
    return status, fields, body


def _unchunked(body: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, body = out + rest[:size], rest[size + 2 :]


def _ids(body: bytes) -> list[int]:
    return [int(line[4:]) for line in body.split(b"\n") if line.startswith(b"id: ")]


async def test_every_line_of_the_stream_ends_in_lf(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await _a_finished_turn(client)
        async with client.stream("GET", f"/v1/sessions/{sid}/events?after=0&until_idle=true") as response:
            assert response.status_code == 200
            body = b"".join([chunk async for chunk in response.aiter_raw()])
    assert b"\r" not in body
    assert body.startswith(b"retry: ") and b"\n\nid: 1\nevent: " in body
    ids = _ids(body)
    assert ids == list(range(1, len(ids) + 1)) and len(ids) > 3


@pytest.mark.parametrize("padded", [b"%d ", b" %d", b"%d\t", b"%d \t "])
async def test_a_last_event_id_with_whitespace_around_it_resumes_after_that_id(
    server: LiveServer, padded: bytes
) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await _a_finished_turn(client)
    path = f"/v1/sessions/{sid}/events?until_idle=true"
    status, _, everything = _raw_get(server, path + "&after=0", b"")
    assert status == "HTTP/1.1 200 OK"
    ids = _ids(everything)
    position = ids[len(ids) // 2]
    status, fields, body = _raw_get(server, path, b"Last-Event-ID: " + padded % position + b"\r\n")
    assert status == "HTTP/1.1 200 OK", body
    assert fields["content-type"].startswith("text/event-stream")
    assert _ids(body) == [seq for seq in ids if seq > position]


async def test_a_last_event_id_that_is_not_a_position_is_a_json_422(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=SAFETY) as client:
        sid = await _a_finished_turn(client)
    status, fields, body = _raw_get(server, f"/v1/sessions/{sid}/events", b"Last-Event-ID: 7 8\r\n")
    assert status.startswith("HTTP/1.1 422"), (status, body)
    assert fields["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] in ("invalid_position", "validation_error")
