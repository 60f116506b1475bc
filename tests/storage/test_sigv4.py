"""app.storage.sigv4 against AWS's own example (the S3 documentation's GET Object with a Range, signed on
2013-05-24 with its example key): the same canonical request, scope and signature, byte for byte. A real
server checking signatures is tests/storage/test_object_store.py."""

from __future__ import annotations

from datetime import UTC, datetime

from app.storage.sigv4 import EMPTY_SHA256, Credentials, canonical_path, sign

EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


def test_aws_example_get_object_is_signed_as_aws_signs_it() -> None:
    headers = sign(
        "GET",
        "examplebucket.s3.amazonaws.com",
        "/test.txt",
        {},
        {"Range": "bytes=0-9"},
        EMPTY_SHA256,
        EXAMPLE,
        "us-east-1",
        datetime(2013, 5, 24, tzinfo=UTC),
    )
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["x-amz-date"] == "20130524T000000Z"
    assert headers["x-amz-content-sha256"] == EMPTY_SHA256
    assert "host" not in headers  # the client sends its own


def test_a_session_token_is_sent_and_signed() -> None:
    headers = sign(
        "PUT",
        "h",
        "/k",
        {},
        {},
        EMPTY_SHA256,
        Credentials("a", "b", "token"),
        "eu-west-1",
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert headers["x-amz-security-token"] == "token"
    assert "x-amz-security-token" in headers["authorization"]


def test_a_key_is_percent_encoded_once_with_its_slashes_kept() -> None:
    assert canonical_path("/bucket/a b/ü~x") == "/bucket/a%20b/%C3%BC~x"
