"""The wire to the LiteLLM child: what travels (parts, errors) comes back equal, and both sides batch:
one write per loop iteration however many messages it produced, one wake-up of a stream's consumer per
batch that arrives. Over a real socket pair, with the service's real `Link` on one end."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.llm.litellm_process import Link, PartQueue
from app.llm.litellm_wire import (
    LineReader,
    Outbox,
    decode_error,
    decode_part,
    encode_error,
    encode_part,
)
from app.llm.types import FinishPart, ProviderError, StreamPart, TextPart, ToolCallPart, UsagePart

pytestmark = pytest.mark.anyio

PARTS: list[StreamPart] = [
    TextPart("héllo\nworld \u2028 \ud800"),  # a newline, a line separator and a lone surrogate, escaped
    ToolCallPart(index=1, id="call_1", name="calculate", arguments='{"expression": "6*7"}'),
    ToolCallPart(index=1, id=None, name=None, arguments=""),
    UsagePart(prompt_tokens=12, completion_tokens=3, total_tokens=15),
    UsagePart(prompt_tokens=9, completion_tokens=4, total_tokens=13, estimated=True),
    FinishPart("tool_calls"),
    FinishPart(None),
]


def test_parts_and_errors_travel_unchanged() -> None:
    line = json.dumps([encode_part(part) for part in PARTS]).encode()
    assert b"\n" not in line
    assert [decode_part(item) for item in json.loads(line)] == PARTS

    error = ProviderError("provider_rate_limited", "Rate limited.", status=429, retryable=True)
    back = decode_error(json.loads(json.dumps(encode_error(error))))
    assert back is not None
    assert (back.code, back.message, back.status) == ("provider_rate_limited", "Rate limited.", 429)
    assert back.retryable is True
    assert decode_error(encode_error(None)) is None


def test_lines_split_anywhere_are_read_whole() -> None:
    reader = LineReader()
    data = b'[["hello",1,42]]\n[["end",1,null],["end",2,null]]\n'
    seen: list[list[Any]] = []
    for n in range(len(data)):
        seen += reader.feed(data[n : n + 1])
    assert seen == [["hello", 1, 42], ["end", 1, None], ["end", 2, None]]


class Pair:
    """A real socket pair: the service's `Link` on one end, the raw other end for the test."""

    def __init__(self, link: Link, transport: asyncio.Transport, peer: socket.socket) -> None:
        self.link, self.transport, self.peer = link, transport, peer
        self.writes: list[bytes] = []
        write = transport.write

        def counting(data: bytes | bytearray | memoryview) -> None:
            self.writes.append(bytes(data))
            write(data)

        transport.write = counting  # type: ignore[method-assign]

    async def read_line(self) -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        data = b""
        while not data.endswith(b"\n"):
            data += await loop.sock_recv(self.peer, 65536)
        [line] = data.splitlines()
        messages: list[list[Any]] = json.loads(line)
        return messages


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    lost: list[Link] = []
    transport, link = await loop.create_unix_connection(lambda: Link(loop, lost.append), sock=ours)
    yield Pair(link, transport, theirs)
    transport.close()
    theirs.close()


async def test_messages_of_one_loop_iteration_leave_in_one_write(pair: Pair) -> None:
    opened = [pair.link.open({"model": f"m{n}"}) for n in range(3)]
    pair.link.cancel(opened[1][0])
    assert pair.writes == []  # nothing is written before the iteration ends
    messages = await pair.read_line()
    assert len(pair.writes) == 1
    ids = [stream_id for stream_id, _ in opened]
    assert messages == [*(["open", i, {"model": f"m{n}"}] for n, i in enumerate(ids)), ["cancel", ids[1]]]


async def test_the_child_side_merges_each_streams_parts_into_one_line(pair: Pair) -> None:
    """The child's Outbox, on the test's end: a hundred parts of two streams, then their ends."""
    loop = asyncio.get_running_loop()
    received: list[list[Any]] = []
    complete = asyncio.Event()

    class Receiver(asyncio.Protocol):
        def __init__(self) -> None:
            self.reader = LineReader()

        def data_received(self, data: bytes) -> None:
            received.extend(self.reader.feed(data))
            if len(received) >= 4:
                complete.set()

    ours, theirs = socket.socketpair()
    transport, _ = await loop.create_unix_connection(Receiver, sock=ours)
    child_transport, _ = await loop.create_unix_connection(asyncio.Protocol, sock=theirs)
    writes: list[bytes] = []
    write = child_transport.write

    def counting(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        write(data)

    child_transport.write = counting  # type: ignore[method-assign]
    outbox = Outbox(loop)
    outbox.attach(child_transport)
    try:
        for n in range(100):
            outbox.send_parts(n % 2, [encode_part(TextPart(str(n)))])
        outbox.send(["end", 0, None])
        outbox.send(["end", 1, None])
        await asyncio.wait_for(complete.wait(), 10)
        assert len(writes) == 1
        assert [m[:2] for m in received] == [["parts", 0], ["parts", 1], ["end", 0], ["end", 1]]
        assert [p[1] for p in received[0][2]] == [str(n) for n in range(0, 100, 2)]
        assert [p[1] for p in received[1][2]] == [str(n) for n in range(1, 100, 2)]
    finally:
        transport.close()
        child_transport.close()


async def test_a_batch_wakes_each_streams_consumer_once(pair: Pair) -> None:
    (first, one), (second, two) = pair.link.open({}), pair.link.open({})
    await pair.read_line()  # the two opens
    batch = [
        ["parts", first, [encode_part(TextPart(str(n))) for n in range(100)]],
        ["parts", second, [encode_part(TextPart("x"))]],
        ["end", first, None],
        ["end", second, encode_error(ProviderError("provider_error", "The model call failed."))],
    ]
    pair.peer.sendall(json.dumps(batch).encode() + b"\n")

    async def drain(channel: PartQueue) -> list[list[StreamPart]]:
        takes = []
        while not (channel.ended and not channel.parts):
            takes.append(await channel.take())
        return takes

    takes_one, takes_two = await asyncio.gather(drain(one), drain(two))
    assert takes_one == [[TextPart(str(n)) for n in range(100)]]  # one wake-up, every part
    assert (one.ended, one.error) == (True, None)
    assert takes_two == [[TextPart("x")]]
    assert two.error is not None and two.error.code == "provider_error"


async def test_a_lost_connection_fails_every_open_stream_retryably(pair: Pair) -> None:
    (_, one), (_, two) = pair.link.open({}), pair.link.open({})
    pair.peer.close()
    for channel in (one, two):
        await asyncio.wait_for(channel.take(), 10)  # wakes with the end
        assert channel.ended
        assert channel.error is not None
        assert (channel.error.code, channel.error.retryable) == ("provider_stream_interrupted", True)
    assert pair.link.closed
    # A stream opened on a lost connection ends at once, the same way.
    _, late = pair.link.open({})
    assert late.ended and late.error is not None and late.error.retryable


async def test_a_line_that_is_not_the_protocol_aborts_the_connection(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    _, channel = pair.link.open({})
    pair.peer.sendall(b"not json\n")
    await asyncio.wait_for(channel.take(), 10)  # wakes with the end: the connection was aborted
    assert pair.link.closed
    assert channel.error is not None
    assert (channel.error.code, channel.error.retryable) == ("provider_stream_interrupted", True)
    assert "the LiteLLM child sent a line that is not the wire protocol" in caplog.text
