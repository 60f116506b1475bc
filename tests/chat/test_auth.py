"""API keys: parsing, constant-time identification, and when a server without keys may serve."""

from __future__ import annotations

import hmac
import json
import re
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from app.chat.auth import ConfigError, KeyRing, is_loopback, load_key_ring, open_mode_refusal
from app.settings import Settings
from tests.support.keys import ALLOWED, EVERY_CHARACTER_KEY, QUERY_UNSAFE

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
UNSAFE_RULE = "without spaces, commas, &, #, + or %"


def ring(api_keys: str = "", keys_file: Path | None = None) -> KeyRing:
    return load_key_ring(Settings(api_keys=api_keys, api_keys_file=keys_file))


def test_keys_from_the_environment_identify_their_principals() -> None:
    keys = ring(f"alice:{ALICE}, bob:{BOB}")
    assert not keys.is_open
    assert keys.principals == {"alice", "bob"}
    assert keys.identify(ALICE) == "alice"
    assert keys.identify(BOB) == "bob"
    assert keys.identify(ALICE[:-1]) is None
    assert keys.identify("") is None
    assert keys.identify("\udcff" * 3) is None  # not even UTF-8: still just unknown


def test_keys_are_kept_only_as_digests() -> None:
    keys = ring(f"alice:{ALICE}")
    assert ALICE not in repr(keys)
    assert ALICE.encode() not in b"".join(digest for _, digest in keys.entries)
    assert ALICE not in repr(Settings(api_keys=f"alice:{ALICE}"))


def test_no_keys_is_open() -> None:
    assert ring().is_open
    assert ring(" , ").is_open


def test_a_keys_file_maps_principals_to_one_key_or_several(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"alice": ALICE, "bob": [BOB, "bob-second-key-0000000000"]}))
    keys = ring(f"carol:{'c' * 20}", keys_file=path)
    assert keys.identify("bob-second-key-0000000000") == "bob"
    assert keys.identify(ALICE) == "alice"
    assert keys.identify("c" * 20) == "carol"


def test_every_configured_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the first key matching costs as many comparisons as none matching, each of equal-length
    digests through hmac.compare_digest."""
    keys = ring(f"alice:{ALICE},bob:{BOB},carol:{'c' * 20}")
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert keys.identify(ALICE) == "alice"
    assert compared == [(32, 32)] * 3
    compared.clear()
    assert keys.identify("nobody-0000000000000000") is None
    assert compared == [(32, 32)] * 3


@pytest.mark.parametrize(
    ("api_keys", "says"),
    [
        ("just-a-key-without-principal", "entry 1 is not of the form principal:key"),
        ("alice:short", "at least 16"),
        (f"alice:{ALICE},bob:{ALICE}", "have the same key"),
        (f"al ice:{ALICE}", "the principal must be"),
        (f":{ALICE}", "the principal must be"),
        ("alice:" + "é" * 20, "printable ASCII"),
        *(
            (
                f"alice:{ALICE[:10]}{c}{ALICE[10:]}",
                "entry 1: the key of 'alice' must .*" + re.escape(UNSAFE_RULE),
            )
            for c in QUERY_UNSAFE
        ),
    ],
)
def test_unusable_keys_are_refused_without_showing_them(api_keys: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as raised:
        ring(api_keys)
    secret = api_keys.partition(":")[2] or api_keys
    assert secret not in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_key_may_hold_every_printable_character_that_travels_unchanged_in_a_url_s_query() -> None:
    """What `?access_token=` reads, sent as typed (curl does not encode it) or percent-encoded, is the key
    itself for every character a key may have; for the four refused, sent as typed, it is something else.
    (The comma, which separates PARLEY_API_KEYS' entries, travels well but is refused all the same.)"""

    def read(target: str) -> str | None:
        """The access_token of a request target, as the server reads it (Starlette uses parse_qsl)."""
        return dict(parse_qsl(urlsplit(target).query, keep_blank_values=True)).get("access_token")

    for c in map(chr, range(0x21, 0x7F)):
        key = f"{ALICE[:10]}{c}{ALICE[10:]}"  # `%` before two hex digits: an escape
        assert read(f"/e?access_token={quote(key, safe='')}&after=1") == key
        assert (read(f"/e?access_token={key}&after=1") == key) is (c not in QUERY_UNSAFE), c
        assert (c in ALLOWED) is (c not in QUERY_UNSAFE + ","), c


def test_a_key_of_every_allowed_character_identifies_its_principal(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"bob": [BOB, EVERY_CHARACTER_KEY[::-1]]}))
    keys = ring(f"alice:{EVERY_CHARACTER_KEY}", keys_file=path)
    assert keys.identify(EVERY_CHARACTER_KEY) == "alice"
    assert keys.identify(EVERY_CHARACTER_KEY[::-1]) == "bob"


def test_a_refused_key_in_a_file_s_list_is_named_by_its_place(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"bob": [BOB, f"new+{BOB}"]}))
    with pytest.raises(ConfigError, match=r"keys.json, key 2 of 'bob': the key of 'bob' must") as raised:
        ring(keys_file=path)
    assert BOB not in str(raised.value)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not valid JSON"),
        ('["alice", "key"]', "must hold an object"),
        ('{"alice": 5}', "must be a string or a list of strings"),
    ],
)
def test_unusable_keys_files_are_refused(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=says):
        ring(keys_file=path)


def test_a_missing_keys_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        ring(keys_file=tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.internal", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_open_mode_is_refused_beyond_loopback_unless_allowed() -> None:
    open_settings = Settings()
    message = open_mode_refusal(open_settings, ring(), "0.0.0.0")
    assert message is not None
    for advice in ("PARLEY_API_KEYS", "PARLEY_API_KEYS_FILE", "PARLEY_ALLOW_OPEN=1", "0.0.0.0"):
        assert advice in message
    assert open_mode_refusal(open_settings, ring(), "127.0.0.1") is None
    assert open_mode_refusal(Settings(allow_open=True), ring(), "0.0.0.0") is None
    assert open_mode_refusal(open_settings, ring(f"alice:{ALICE}"), "0.0.0.0") is None


def test_cors_origins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().cors_origins == []
    monkeypatch.setenv("PARLEY_CORS_ORIGINS", "https://a.example, https://b.example")
    assert Settings().cors_origins == ["https://a.example", "https://b.example"]
    monkeypatch.setenv("PARLEY_CORS_ORIGINS", '["https://c.example"]')
    assert Settings().cors_origins == ["https://c.example"]
