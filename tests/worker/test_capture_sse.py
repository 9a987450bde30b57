"""The capturing proxy's reading of a streamed answer's ``data:`` lines, however the stream is cut into reads."""

from __future__ import annotations

import random

import pytest

from rollq.worker.capture.tokens import iter_sse_data

STREAM = (
    b": a comment\n"
    b'data: {"id":"a","choices":[{"delta":{"content":"x"}}]}\r\n'
    b"\r\n"
    b"event: message\n"
    b'data:{"id":"b"}\n'
    b"data:   \t\n"
    b"\n"
    b'data: {"id":"c"}  \r\n'
    b"id: 7\n"
    b"data\n"
    b"dat\r\n"
    b'data: {"id":"d","x":"data: inside"}\n\n'
    b"data: [DONE]\n\n"
    b"data: cut before its line ends"
)
EXPECTED = [
    b'{"id":"a","choices":[{"delta":{"content":"x"}}]}',
    b'{"id":"b"}',
    b"",
    b'{"id":"c"}',
    b'{"id":"d","x":"data: inside"}',
    b"[DONE]",
]


@pytest.mark.parametrize("seed", range(40))
def test_every_complete_data_line_is_read_once_wherever_the_reads_cut_the_stream(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(0, 30)))
    pieces = [STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(STREAM)], strict=True)]
    buffer = bytearray()
    read: list[bytes] = []
    for piece in pieces:
        payloads = iter_sse_data(buffer, piece)
        assert all(type(p) is bytes for p in payloads)
        read += payloads
    assert read == EXPECTED
    assert bytes(buffer) == b"data: cut before its line ends"  # kept until its line ends
