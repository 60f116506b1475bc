"""A prompt's attached files (app.turns.prompt, app.turns.attachments): a user message's attachments
become content parts, merged with the text of the messages taken with it, and at the turn's start each
becomes what models take, read from a real database: an image as an `image_url` data URL, a PDF as a
`file` part, a text file as text with its name; a file no longer stored is said so, not sent."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.protocol.files import Attachment
from app.storage import files
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import ChatMessageRow, FileRow
from app.turns.attachments import label, with_files
from app.turns.prompt import FILE_PART, rebuild
from tests.fakes.strict import validate_history

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n fake image bytes \x00\xff"


def attachment(
    file_id: str, name: str, media_type: str, size: int, width: int | None = None
) -> dict[str, Any]:
    return Attachment(
        file_id=file_id, name=name, media_type=media_type, size=size, width=width, height=width
    ).model_dump()


def user(n: int, text: str, attachments: list[dict[str, Any]] | None = None) -> ChatMessageRow:
    return ChatMessageRow(
        position=n,
        id=f"m_{n:012x}",
        session_id="s_1",
        turn_id="t_1",
        type="text",
        role="user",
        content=text,
        sender="alice",
        timestamp="2026-11-29T04:00:00.000+00:00",
        attachments=attachments,
    )


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(database_url)
    yield db
    await db.dispose()


async def put(database: Database, data: bytes, media_type: str) -> str:
    sha = hashlib.sha256(data).hexdigest()
    row = FileRow(
        id=f"f_{sha[:16]}",
        principal="",
        name="x",
        media_type=media_type,
        size=len(data),
        sha256=sha,
        created_at="2026-11-29T04:00:00.000+00:00",
    )
    await DatabaseBlobs(database, 5).put(sha, len(data), io.BytesIO(data))  # in parts of 5 bytes
    async with database.session() as db:
        await files.insert_file(db, row)
        await db.commit()
    return row.id


def test_attachments_become_parts_and_messages_taken_together_stay_one_user_turn() -> None:
    shot = attachment("f_1", "a.png", "image/png", 9, 4)
    messages = rebuild([user(1, "first"), user(2, "look", [shot])], "be brief")
    assert messages == [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "look"},
                {"type": FILE_PART, "file": shot},
            ],
        },
    ]
    # Without attachments the content stays a string, as before.
    assert rebuild([user(3, "a"), user(4, "b")], None) == [{"role": "user", "content": "a\n\nb"}]


def test_the_label_names_the_file_and_its_dimensions() -> None:
    assert (
        label(attachment("f_1", "a.png", "image/png", 9, 4))
        == "[Attached file: a.png (image/png, 9 bytes, 4x4 pixels)]"
    )
    assert (
        label(attachment("f_2", "n.md", "text/markdown", 3))
        == "[Attached file: n.md (text/markdown, 3 bytes)]"
    )


async def test_files_are_read_into_the_parts_models_take(database: Database) -> None:
    png = await put(database, PNG, "image/png")
    pdf_bytes = b"%PDF-1.7 a document"
    pdf = await put(database, pdf_bytes, "application/pdf")
    text = await put(database, "ünïcode notes".encode(), "text/plain")
    shown = [
        attachment(png, "a.png", "image/png", len(PNG), 4),
        attachment(pdf, "p.pdf", "application/pdf", len(pdf_bytes)),
        attachment(text, "n.txt", "text/plain", 15),
        attachment("f_0000000000000000", "gone.png", "image/png", 1, 1),
    ]
    messages = await with_files(
        database, DatabaseBlobs(database, 5), rebuild([user(1, "what?", shown)], None)
    )
    assert messages[0]["content"] == [
        {"type": "text", "text": "what?"},
        {"type": "text", "text": label(shown[0])},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
        },
        {"type": "text", "text": label(shown[1])},
        {
            "type": "file",
            "file": {
                "filename": "p.pdf",
                "file_data": "data:application/pdf;base64," + base64.b64encode(pdf_bytes).decode(),
            },
        },
        {"type": "text", "text": label(shown[2]) + "\nünïcode notes"},
        {"type": "text", "text": label(shown[3]) + " [its content is no longer stored]"},
    ]
    assert validate_history(messages) == []


async def test_a_prompt_without_files_reads_nothing(database: Database) -> None:
    messages = rebuild([user(1, "plain")], None)
    await database.dispose()  # a read would fail now
    assert await with_files(database, DatabaseBlobs(database, 5), messages) == [
        {"role": "user", "content": "plain"}
    ]


async def test_image_and_document_parts_are_named_and_by_reference_not_read(
    database: Database,
) -> None:
    png = await put(database, PNG, "image/png")
    pdf = await put(database, b"%PDF-1.7 a document", "application/pdf")
    text = await put(database, b"notes", "text/plain")
    shown = [
        attachment(png, "a.png", "image/png", len(PNG), 4),
        attachment(text, "n.txt", "text/plain", 5),
        attachment(pdf, "p.pdf", "application/pdf", 19),
    ]
    attached: list[dict[int, dict[str, Any]]] = []
    messages = await with_files(
        database, DatabaseBlobs(database, 5), rebuild([user(1, "what?", shown)], "be brief"), attached
    )
    # The system message has none; the user's image at part 2 and document at part 5 (after their labels).
    assert attached == [{}, {2: shown[0], 5: shown[2]}]
    assert [p["type"] for p in messages[1]["content"]] == [
        "text",
        "text",
        "image_url",
        "text",
        "text",
        "file",
    ]
    # By reference: the same parts, the image's and document's data the file's URL; the text file read.
    referenced: list[dict[int, dict[str, Any]]] = []
    again = await with_files(
        database,
        DatabaseBlobs(database, 5),
        rebuild([user(1, "what?", shown)], None),
        referenced,
        by_reference=True,
    )
    assert referenced == [{2: shown[0], 5: shown[2]}]
    content = again[0]["content"]
    assert content[2] == {"type": "image_url", "image_url": {"url": f"/v1/files/{png}/content"}}
    assert content[3] == {"type": "text", "text": label(shown[1]) + "\nnotes"}
    assert content[5] == {
        "type": "file",
        "file": {"filename": "p.pdf", "file_data": f"/v1/files/{pdf}/content"},
    }
