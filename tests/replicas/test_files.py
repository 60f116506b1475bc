"""Files across replicas on one PostgreSQL database (docs/files.md, Storage and lifetime): a file uploaded to
one replica is served by another, byte for byte, and still after the replica that took it is killed
(kill -9); a turn on the other replica reads it from the database: the demo model describes the image,
and the strict fake upstream receives the text file's exact text."""

from __future__ import annotations

import base64

import pytest

from tests.fakes.upstream import FakeUpstream, Script
from tests.interrupt.conftest import MODEL
from tests.replicas.conftest import Replicas, clients

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAABCAIAAAB7QOjdAAAAD0lEQVR4nGP8z8DAwMAAAAYIAQHLR3Z1AAAAAElFTkSuQmCC"
)
NOTES = "Grüße from replica A\n".encode()


async def test_a_file_uploaded_to_one_replica_is_served_and_read_by_another_after_a_kill(
    replicas: Replicas, upstream: FakeUpstream
) -> None:
    first, second = await replicas(2)
    async with clients(first, second) as (a, b):
        shot = (await a.post("/v1/files", files={"file": ("shot.png", PNG)})).json()
        notes = (await a.post("/v1/files", files={"file": ("notes.txt", NOTES)})).json()
        first.kill()  # kill -9: what it answered was committed
        assert (await b.get(f"/v1/files/{shot['id']}/content")).content == PNG
        assert (await b.get(f"/v1/files/{notes['id']}")).json() == notes

        demo = (await b.post("/v1/sessions", json={"model": "parley/demo"})).json()["id"]
        turn = await b.post(
            f"/v1/sessions/{demo}/messages?wait=true",
            json={"content": "what is it?", "attachments": [{"file_id": shot["id"]}]},
        )
        assert turn.status_code == 200, turn.text
        assert turn.json()["final_answer"].startswith(
            f"I received 1 file: shot.png (image/png, {len(PNG)} bytes, 2x1 pixels)."
        )

        upstream.enqueue(Script.text("Read it."))
        fake = (await b.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        turn = await b.post(
            f"/v1/sessions/{fake}/messages?wait=true",
            json={"content": "read", "attachments": [{"file_id": notes["id"]}]},
        )
        assert turn.status_code == 200, turn.text
        assert upstream.requests[-1].body["messages"][-1]["content"] == [
            {"type": "text", "text": "read"},
            {
                "type": "text",
                "text": f"[Attached file: notes.txt (text/plain, {len(NOTES)} bytes)]\n{NOTES.decode()}",
            },
        ]
