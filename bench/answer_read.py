"""Reading an LLM answer into a call's record: the typed pass beside parsing all of it, in one run.

Run: python bench/answer_read.py [--runs 2000] [--repeats 5]

The capturing proxy reads every answer, whole or streamed, into its call's record and the record's span attributes.
Three readers, each with the proxy's own functions but the first, over the same answers, taking turns (the order
reversed every repeat):

- ``before``: the proxy's reader as of 3336d74, copied here (:func:`loads_before`): the answer searched for a run of
  19 digits (an int orjson would read as a float), then parsed whole by orjson, or by ``json`` where such a run
  was found; read by ``tokens.read_response``, the token ids written back to JSON text for the span;
- ``parsed``: the same with today's ``codec.loads`` (msgspec, exact for ints of any size, so nothing searched for):
  what an answer of another shape than vLLM's and OpenAI's gets now;
- ``typed``: ``answers.read_whole``, msgspec decoding only the fields a record takes, token ids kept as the text
  they came in: what vLLM's and OpenAI's answers get now.

Each then builds the call's span attributes (``spans.attributes``, as the proxy records it). Answers, in vLLM's
shape (``return_token_ids`` and logprobs asked, as a training run asks):

- ``bench``: the answer bench/call_rate.py's record work reads (40 prompt ids, one answer token, no logprobs),
  the size of the demo's simulated LLM answers that bench/capture.py and bench/call_rate.py forward;
- ``chat_2k``: 2,000 prompt ids, 200 answer tokens with their logprobs (each entry with token, bytes and an empty
  ``top_logprobs``, as vLLM writes them);
- ``chat_8k``: 8,000 prompt ids, 1,000 answer tokens with logprobs;
- ``stream_2k``, ``stream_8k``: the same answered as a stream (2,000 prompt ids and 200 tokens, 8,000 and 500): the
  prompt's ids in the first chunk, then a chunk a token with its id and logprob entry, each parsed and fed to
  ``StreamAssembler`` (``before`` and ``parsed`` only: streamed chunks have no typed pass. One was built, and
  ``--out answer_read_typed_chunks`` at 126006e measured it beside the parsed chunks: 0.84-0.98x of their CPU,
  0.02-0.27 ms a stream, so it was taken out again).

CPU microseconds per answer (``time.thread_time``), back to back and with a 0.5 ms sleep after each (issue 24's
call rate: bursts about 1 ms apart start with cold caches), less what the same sleeps cost the thread with no
work; medians of ``--repeats``. Whether ``before`` read an answer with ``json`` is recorded with it: the answers'
logprobs are uniform in (-1, 0), and one within 0.01 of zero is written with a run of 18-19 digits.
Writes bench/results/answer_read.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result  # noqa: E402
from rollq.worker.capture import answers, codec, spans, tokens  # noqa: E402
from rollq.worker.capture.calls import CallKind, CapturedCall  # noqa: E402

GAPS_MS = {"back_to_back": 0.0, "between_sleeps": 0.5}
_MESSAGES = [{"role": "user", "content": "Compute 2 + 3. " * 8}]


def answer(prompt_ids: int, answer_tokens: int, *, logprobs: bool) -> bytes:
    """A vLLM chat answer (``return_token_ids``, and logprobs when asked) of that many ids."""
    rng = random.Random(prompt_ids)
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "word " * answer_tokens, "tool_calls": []},
        "finish_reason": "stop",
        "token_ids": [rng.randrange(151_000) for _ in range(answer_tokens)],
    }
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": "word", "logprob": -rng.random(), "bytes": [119, 111, 114, 100], "top_logprobs": []}
                for _ in range(answer_tokens)
            ]
        }
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "policy",
            "choices": [choice],
            "prompt_token_ids": [rng.randrange(151_000) for _ in range(prompt_ids)],
            "usage": {"prompt_tokens": prompt_ids, "completion_tokens": answer_tokens, "total_tokens": 0},
        }
    )


def stream(prompt_ids: int, answer_tokens: int) -> list[bytes]:
    """A vLLM chat stream's chunks (``return_token_ids`` and logprobs asked): the prompt's ids in the first, then a
    token a chunk with its id and logprob entry, then the finish reason and the usage."""
    rng = random.Random(prompt_ids + 1)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "policy"}
    first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    chunks = [{**head, "choices": [first], "prompt_token_ids": [rng.randrange(151_000) for _ in range(prompt_ids)]}]
    for _ in range(answer_tokens):
        entry = {"token": "word", "logprob": -rng.random(), "bytes": [119, 111, 114, 100], "top_logprobs": []}
        choice = {"index": 0, "delta": {"content": "word "}, "logprobs": {"content": [entry]}, "finish_reason": None}
        chunks.append({**head, "choices": [{**choice, "token_ids": [rng.randrange(151_000)]}]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": []}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": prompt_ids, "completion_tokens": answer_tokens}})
    return [orjson.dumps(chunk) for chunk in chunks]


ANSWERS: dict[str, bytes | list[bytes]] = {
    "bench": answer(40, 1, logprobs=False),
    "chat_2k": answer(2_000, 200, logprobs=True),
    "chat_8k": answer(8_000, 1_000, logprobs=True),
    "stream_2k": stream(2_000, 200),
    "stream_8k": stream(8_000, 500),
}


def _call() -> CapturedCall:
    return CapturedCall(
        kind=CallKind.CHAT, resource="main", path="chat/completions", start_ns=1, request_model="policy",
        messages=_MESSAGES, status=200, end_ns=2,
    )  # fmt: skip


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def _has_19_digits(data: bytes) -> bool:
    """The search the codec as of 3336d74 made before every parse: an int orjson would read as a float, maybe."""
    return b"0" * 19 in data.translate(_DIGITS_AS_ZERO)


def loads_before(data: bytes) -> Any:
    """``rollq.worker.capture.codec.loads`` as of 3336d74 (orjson unless a run of 19 digits says it may differ)."""
    if not _has_19_digits(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def _streamed(chunks: list[bytes], loads: Callable[[bytes], Any]) -> dict[str, Any]:
    assembler = tokens.StreamAssembler(_call())
    for chunk in chunks:
        assembler.feed(loads(chunk))
    return spans.attributes(assembler.finish())


def _parsing_with(loads: Callable[[bytes], Any]) -> Callable[[bytes | list[bytes]], dict[str, Any]]:
    """A reader that parses the whole answer (or each chunk) with ``loads``, then reads it as the proxy does."""

    def read(data: bytes | list[bytes]) -> dict[str, Any]:
        if isinstance(data, list):
            return _streamed(data, loads)
        call = _call()
        tokens.read_response(call, loads(data))
        return spans.attributes(call)

    return read


before = _parsing_with(loads_before)
parsed = _parsing_with(codec.loads)


def typed(data: bytes) -> dict[str, Any]:
    call = _call()
    assert answers.read_whole(call, data)
    return spans.attributes(call)


READERS: dict[str, Callable[[Any], dict[str, Any]]] = {"before": before, "parsed": parsed, "typed": typed}


def _readers(data: bytes | list[bytes]) -> dict[str, Callable[[Any], dict[str, Any]]]:
    """A stream has no typed pass: its chunks are parsed (tried and not kept, see the module docstring)."""
    return READERS if isinstance(data, bytes) else {name: READERS[name] for name in ("before", "parsed")}


def _size(data: bytes | list[bytes]) -> int:
    return sum(map(len, data)) if isinstance(data, list) else len(data)


def _read_by_json(data: bytes | list[bytes]) -> bool:
    """Whether ``loads_before`` sent the answer (or any chunk of it) to ``json``."""
    return any(map(_has_19_digits, data if isinstance(data, list) else [data]))


def _cpu_us(reader: Callable[[Any], Any] | None, data: bytes | list[bytes], n: int, gap_ms: float) -> float:
    started = time.thread_time()
    for _ in range(n):
        if reader is not None:
            reader(data)
        if gap_ms:
            time.sleep(gap_ms / 1000)
    return (time.thread_time() - started) / n * 1e6


def measure(data: bytes | list[bytes], runs: int, repeats: int) -> dict[str, Any]:
    """Per gap and reader: the median over repeats of CPU us per answer, less the sleeps alone; and per repeat, the
    proxy's reader now (the last) over ``before``."""
    readers = _readers(data)
    now = list(readers)[-1]
    row: dict[str, Any] = {"bytes": _size(data), "before_read_by_json": _read_by_json(data), "now": now}
    for label, gap_ms in GAPS_MS.items():
        samples: dict[str, list[float]] = {name: [] for name in readers}
        for repeat in range(repeats):
            order = list(readers) if repeat % 2 == 0 else list(reversed(readers))
            for name in order:
                used = _cpu_us(readers[name], data, runs, gap_ms)
                alone = _cpu_us(None, data, runs, gap_ms) if gap_ms else 0.0
                samples[name].append(used - alone)
        medians = {name: round(statistics.median(values), 1) for name, values in samples.items()}
        row[label] = {
            **{f"{name}_us": value for name, value in medians.items()},
            **{
                f"{name}_over_before": round(medians[name] / medians["before"], 2)
                for name in medians
                if name != "before"
            },
            "per_repeat_now_over_before": [
                round(n / b, 2) for n, b in zip(samples[now], samples["before"], strict=True)
            ],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="answers read per reader, repeat and gap (2000)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per reader and gap; medians (default 5)")
    parser.add_argument("--out", default="answer_read", help="results name: bench/results/<out>.json")
    args = parser.parse_args()
    for data in ANSWERS.values():  # the readers give the same attributes
        assert len({json.dumps(read(data), sort_keys=True) for read in _readers(data).values()}) == 1
    rows = {}
    for name, data in ANSWERS.items():
        runs = max(200, args.runs * _size(ANSWERS["bench"]) // _size(data)) if name != "bench" else args.runs
        rows[name] = {"runs": runs, **measure(data, runs, args.repeats)}
        print(name, json.dumps(rows[name]), flush=True)
    write_result(args.out, {"answers": rows}, sys.argv[1:], settings=vars(args))


if __name__ == "__main__":
    main()
