"""A prompt's attached files in the form models take (docs/files.md, To the model), OpenAI's content parts:
an image as an `image_url` part with a data URL, a PDF as a `file` part with its data (or as its text, for
a model that does not read documents, with PARLEY_FILES_PDF_TEXT), a text-like file as text with its name;
each after a line that names the file. The Anthropic reader turns them into its own image and document
blocks (llm.anthropic), LiteLLM into its providers'.

Read at a turn's start, before the model is called: the rows in one short read, then each file's bytes
from the blob store (app.storage.blobs).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from app.llm.gateway import ModelGateway
from app.settings import Settings
from app.storage import files
from app.storage.blobs import Blobs
from app.storage.engine import Database
from app.turns.pdf_text import pdf_text
from app.turns.prompt import FILE_PART


def label(file: dict[str, Any]) -> str:
    """The line before an attached file: its name, type, size and, for an image, its dimensions."""
    size = f"{file['media_type']}, {file['size']} bytes"
    if file.get("width") and file.get("height"):
        size += f", {file['width']}x{file['height']} pixels"
    return f"[Attached file: {file['name']} ({size})]"


async def pdf_text_limit(settings: Settings, models: ModelGateway, model: str) -> int | None:
    """How a PDF goes to `model`: as its text, at most this many characters, for a model that does not
    read documents when PARLEY_FILES_PDF_TEXT is on; None: as a file part."""
    if settings.files_pdf_text and not (await models.takes_files(model))[1]:
        return settings.max_message_chars
    return None


async def with_files(
    database: Database,
    blobs: Blobs,
    messages: list[dict[str, Any]],
    attached: list[dict[int, dict[str, Any]]] | None = None,
    *,
    by_reference: bool = False,
    pdf_text_limit: int | None = None,
) -> list[dict[str, Any]]:
    """`messages` with every FILE_PART replaced by the file's parts (the list is changed in place).
    `attached`, when given, is filled aligned with `messages`: for each, its image and document parts by
    their index in its content, with the file each is (its id, name and media type): the context planner
    names a file it leaves out of a prompt (turns.context). `by_reference`: an image's or a document's
    part names the file's URL in this API instead of carrying its bytes, which are not read (what a
    call would send, shown without the data: GET .../context); a file sent as text is read and sent whole.
    `pdf_text_limit`: a PDF goes as its text, at most that many characters (a model that does not read
    documents, with PARLEY_FILES_PDF_TEXT); None: as a file part."""
    wanted = {
        part["file"]["file_id"]: part["file"]
        for message in messages
        if message["role"] == "user" and isinstance(message["content"], list)
        for part in message["content"]
        if part.get("type") == FILE_PART
    }

    def as_text(file: dict[str, Any]) -> bool:
        media_type = str(file["media_type"])
        return _is_text(media_type) or (media_type == "application/pdf" and pdf_text_limit is not None)

    read = [f for f, file in wanted.items() if not by_reference or as_text(file)]
    loaded = await _load(database, blobs, read) if read else {}
    for message in messages:
        found: dict[int, dict[str, Any]] = {}
        if wanted and message["role"] == "user" and isinstance(message["content"], list):
            content: list[dict[str, Any]] = []
            for part in message["content"]:
                if part.get("type") != FILE_PART:
                    content.append(part)
                    continue
                file = part["file"]
                data = loaded.get(file["file_id"])
                converted_parts = (
                    _referenced(file)
                    if by_reference and not as_text(file)
                    else _parts(file, data, pdf_text_limit)
                )
                for converted in converted_parts:
                    if converted["type"] in ("image_url", "file"):
                        found[len(content)] = file
                    content.append(converted)
            message["content"] = content
        if attached is not None:
            attached.append(found)
    return messages


def _is_text(media_type: str) -> bool:
    return media_type.startswith("text/") or media_type == "application/json"


def _referenced(file: dict[str, Any]) -> list[dict[str, Any]]:
    """An image's or document's parts with the file's URL in this API where the call sends its data."""
    url = f"/v1/files/{file['file_id']}/content"
    if str(file["media_type"]).startswith("image/"):
        return [{"type": "text", "text": label(file)}, {"type": "image_url", "image_url": {"url": url}}]
    document = {"filename": file["name"], "file_data": url}
    return [{"type": "text", "text": label(file)}, {"type": "file", "file": document}]


async def _load(database: Database, blobs: Blobs, file_ids: Sequence[str]) -> dict[str, bytes]:
    async with database.read() as db:
        rows = [row for file_id in file_ids if (row := await files.any_file(db, file_id)) is not None]
    found: dict[str, bytes] = {}
    for row in rows:
        chunks = [data async for data in blobs.read(row.sha256)]
        if chunks or row.size == 0:
            found[row.id] = b"".join(chunks)
    return found


def _parts(file: dict[str, Any], data: bytes | None, pdf_text_limit: int | None) -> list[dict[str, Any]]:
    media_type = str(file["media_type"])
    if data is None:  # cannot happen while a message links it; said plainly rather than failing the turn
        return [{"type": "text", "text": f"{label(file)} [its content is no longer stored]"}]
    if _is_text(media_type):
        text = data.decode("utf-8", "replace")
        return [{"type": "text", "text": f"{label(file)}\n{text}"}]
    if media_type == "application/pdf" and pdf_text_limit is not None:
        extracted = pdf_text(data, pdf_text_limit)
        if extracted is None:
            return [{"type": "text", "text": f"{label(file)} [its text could not be read]"}]
        return [{"type": "text", "text": f"{label(file)} [its text, extracted]\n{extracted}"}]
    url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
    if media_type.startswith("image/"):
        return [{"type": "text", "text": label(file)}, {"type": "image_url", "image_url": {"url": url}}]
    return [
        {"type": "text", "text": label(file)},
        {"type": "file", "file": {"filename": file["name"], "file_data": url}},
    ]
