"""A fake vLLM for the AL 1.0 tests: :class:`fake_vllm.FakeVLLM` whose answers follow a hint in the prompt.

A user message containing ``HINT=<x>`` is answered ``### ANSWER: <x> ###``, so a test decides which
rollouts earn reward 1 (``RESULT`` equal to the hint) and which 0; other calls get ``reply <n>``.
Token ids are still the fake's (code point + 1000), kept per response in ``sent``.
"""

from __future__ import annotations

import re
from typing import Any

from tests.support.fake_vllm import FakeVLLM, Sent, _prompt_text, tokenize

_HINT = re.compile(r"HINT=(\S+)")


class HintedVLLM(FakeVLLM):
    def _answer(self, body: dict[str, Any], chat: bool) -> tuple[str, str, Sent]:
        response_id, text, sent = super()._answer(body, chat)
        last = next((m for m in reversed(body.get("messages") or []) if m.get("role") == "user"), None)
        hint = _HINT.search(_prompt_text(body, chat)) if last and "final answer" in str(last.get("content")) else None
        if hint is None:
            return response_id, text, sent
        text = f"### ANSWER: {hint.group(1)} ###"
        logprobs = [-0.01 * (i + 1) for i in range(len(text))] if body.get("logprobs") else None
        sent = Sent(sent.prompt_token_ids, tokenize(text), text, logprobs, sent.streamed)
        self.sent[response_id] = sent
        return response_id, text, sent
