"""`python -m app migrate-files` (docs/files.md, Storage): every file's bytes copied from the database into an
S3-compatible bucket (a real server that checks signatures: tests/support/s3.py) and back, byte for byte;
a second run copies nothing; a database not at head, or missing AWS keys, is one line and exit 2."""

from __future__ import annotations

import asyncio
import hashlib
import io
import secrets
import sqlite3

import pytest

from app.__main__ import main
from app.storage import files
from app.storage.blobs import DatabaseBlobs
from app.storage.engine import Database
from app.storage.tables import FileRow
from tests.support.s3 import S3Server, s3_server

__all__ = ["s3_server"]

BLOBS = [secrets.token_bytes(10_000), b"a small one"]


async def _store(url: str) -> None:
    database = Database(url)
    try:
        for n, data in enumerate(BLOBS):
            sha256 = hashlib.sha256(data).hexdigest()
            await DatabaseBlobs(database, 4096).put(sha256, len(data), io.BytesIO(data))
            async with database.session() as db:
                await files.insert_file(
                    db,
                    FileRow(
                        id=f"f_000000000000000{n}",
                        principal="alice",
                        name=f"{n}.pdf",
                        media_type="application/pdf",
                        size=len(data),
                        sha256=sha256,
                        created_at="2026-11-29T04:00:00.000+00:00",
                    ),
                )
                await db.commit()
    finally:
        await database.dispose()


async def _read_back(url: str) -> list[bytes]:
    database = Database(url)
    try:
        blobs = DatabaseBlobs(database, 4096)
        return [
            b"".join([part async for part in blobs.read(hashlib.sha256(data).hexdigest())]) for data in BLOBS
        ]
    finally:
        await database.dispose()


def test_files_bytes_go_into_the_bucket_and_back(
    database_url: str,
    s3_server: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bucket = f"parley-{secrets.token_hex(4)}"
    s3_server.create_bucket(bucket)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PARLEY_DATABASE_URL", database_url)
    asyncio.run(_store(database_url))

    assert main(["migrate-files", "--to", f"s3://{bucket}/moved"]) == 0
    assert "2 held by files, 2 copied" in capsys.readouterr().out
    assert sorted(s3_server.keys(bucket)) == sorted(f"moved/{hashlib.sha256(d).hexdigest()}" for d in BLOBS)
    assert main(["migrate-files", "--to", f"s3://{bucket}/moved"]) == 0
    assert "2 held by files, 0 copied" in capsys.readouterr().out

    with sqlite3.connect(database_url.split("///", 1)[1]) as connection:
        connection.execute("DELETE FROM file_chunks")
    assert asyncio.run(_read_back(database_url)) == [b"", b""]
    assert main(["migrate-files", "--from", f"s3://{bucket}/moved"]) == 0
    assert "2 held by files, 2 copied" in capsys.readouterr().out
    assert asyncio.run(_read_back(database_url)) == BLOBS


def test_without_aws_keys_it_is_one_line(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("PARLEY_DATABASE_URL", database_url)
    assert main(["migrate-files", "--to", "s3://bucket"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "parley: PARLEY_FILES_URL names an S3 bucket: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    ]
