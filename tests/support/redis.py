"""Redis for the multi-replica tests: the machine's server (PARLEY_TEST_REDIS_URL, default
redis://127.0.0.1:6379/0) under a key prefix of the test's own, removed afterwards; or a redis-server
process of the test's own on a free port, for tests that stop and restart it.

Where no Redis is reachable the tests skip with one line; under CI=true that skip is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.server import free_port

REDIS_URL = os.environ.get("PARLEY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_redis() -> None:
    """Skips (fails under CI=true) when no Redis is reachable."""
    try:
        with redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2) as client:
            client.ping()
        return
    except (redis.RedisError, OSError) as exc:
        reason = f"{type(exc).__name__}: {exc}"
    message = f"Redis not reachable at {REDIS_URL} ({reason}); start one or set PARLEY_TEST_REDIS_URL"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true requires Redis: {message}", pytrace=False)
    pytest.skip(message)


def new_prefix() -> str:
    return f"parley-test-{os.getpid()}-{secrets.token_hex(4)}"


def remove_keys(url: str, prefix: str) -> int:
    """Deletes every key under the prefix; how many there were."""
    with redis.Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        return len(keys)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of the test's own on the machine's Redis; its keys are removed afterwards."""
    require_redis()
    prefix = new_prefix()
    try:
        yield prefix
    finally:
        remove_keys(REDIS_URL, prefix)


class RedisServer:
    """`redis-server` on a free port, without persistence: stopping it loses everything, as a crash of
    an in-memory cache does."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("CI") == "true":
                pytest.fail("CI=true requires redis-server on the PATH", pytrace=False)
            pytest.skip("redis-server not on the PATH; install Redis to run this test")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as client:
                    client.ping()
                return
            except (redis.RedisError, OSError):
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on {self.port} did not answer within 10 s")

    def stop(self) -> None:
        """kill -9: the data is gone with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
