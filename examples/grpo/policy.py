"""A policy small enough to learn on two CPU cores in minutes: it reverses short words, one letter at a time.

The tokenizer is one id per character of a fixed alphabet; a chat prompt is rendered as
``<user>reverse: abc<assistant>``. The model sees the word's letters (one-hot), the position it is writing and
the letter it wrote last, and gives logits over the letters: an autoregressive policy, sampled token by token,
with per-token log-probabilities the trainer can recompute exactly from the recorded token ids.

Shared by the inference server (sampling) and the trainer (the GRPO loss): one place for the tokenizer and the
forward pass, so the ids the server returned are the ids the trainer scores.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

LETTERS = "abcd"
WORD_LENGTH = 3
_SPECIALS = ["<user>", "<assistant>", "<system>"]
_CHARS = LETTERS + "efghijklmnopqrstuvwxyz :?.,!0123456789"
VOCAB = {c: i for i, c in enumerate(_CHARS)} | {s: len(_CHARS) + i for i, s in enumerate(_SPECIALS)}
ID_TO_TOKEN = {i: t for t, i in VOCAB.items()}
PROMPT_PREFIX = "reverse: "


def render_chat(messages: list[dict[str, Any]]) -> list[int]:
    """The token ids of a chat: each message as ``<role>`` and its characters, then ``<assistant>``."""
    ids: list[int] = []
    for message in messages:
        ids.append(VOCAB.get(f"<{message.get('role', 'user')}>", VOCAB["<user>"]))
        ids += [VOCAB[c] for c in str(message.get("content") or "").lower() if c in VOCAB]
    ids.append(VOCAB["<assistant>"])
    return ids


def decode(ids: list[int]) -> str:
    return "".join(ID_TO_TOKEN[i] for i in ids)


def word_of(prompt_ids: list[int]) -> list[int]:
    """The letters of the word to reverse: the last WORD_LENGTH letter ids before ``<assistant>`` (padded)."""
    letters = [i for i in prompt_ids if i < len(LETTERS)]
    word = letters[-WORD_LENGTH:]
    return [0] * (WORD_LENGTH - len(word)) + word


class ReversePolicy(nn.Module):
    """logits(letter | word, position, previous letter): a linear map of (word x position) and the previous letter.

    The features cross each letter slot of the word with the position being written, so "write the last letter
    first" is a linear function of them: small enough to learn in tens of GRPO steps on a CPU.
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        width = WORD_LENGTH * len(LETTERS) * WORD_LENGTH + len(LETTERS) + 1
        self.net = nn.Linear(width, len(LETTERS))

    def features(self, word: list[int], previous: list[int]) -> torch.Tensor:
        """One row per position: word one-hot x position one-hot, then the previous letter one-hot (or start)."""
        word_hot = torch.zeros(WORD_LENGTH * len(LETTERS))
        for k, letter in enumerate(word):
            word_hot[k * len(LETTERS) + letter] = 1.0
        rows = []
        for position, prev in enumerate(previous):
            pos_hot = torch.zeros(WORD_LENGTH)
            pos_hot[min(position, WORD_LENGTH - 1)] = 1.0
            prev_hot = torch.zeros(len(LETTERS) + 1)
            prev_hot[len(LETTERS) if prev < 0 else prev] = 1.0
            rows.append(torch.cat([torch.kron(word_hot, pos_hot), prev_hot]))
        return torch.stack(rows)

    def token_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
        """log p(response token t | prompt, tokens before t), for each t: what the GRPO ratio needs."""
        previous = [-1, *response_ids[:-1]]
        logits = self.net(self.features(word_of(prompt_ids), previous))
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(1, torch.tensor(response_ids).unsqueeze(1)).squeeze(1)

    @torch.no_grad()
    def sample(
        self, prompt_ids: list[int], max_tokens: int, temperature: float, generator: torch.Generator
    ) -> tuple[list[int], list[float]]:
        """Sampled letter ids and their log-probabilities under the sampling distribution (greedy at 0)."""
        word = word_of(prompt_ids)
        ids: list[int] = []
        logprobs: list[float] = []
        for _ in range(min(max_tokens, WORD_LENGTH)):
            logits = self.net(self.features(word, [-1, *ids])[-1])  # the row of the position being written
            if temperature <= 0:
                token = int(torch.argmax(logits))
                logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
            else:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                logprobs.append(float(logp[token]))
            ids.append(token)
        return ids, logprobs

    def state_json(self) -> dict[str, Any]:
        """The weights as JSON-ready lists: how the trainer ships them to the inference server."""
        return {name: tensor.tolist() for name, tensor in self.state_dict().items()}

    def load_state_json(self, state: dict[str, Any]) -> None:
        self.load_state_dict({name: torch.tensor(value) for name, value in state.items()})


def reward(word: str, answer: str) -> float:
    """The verifiable reward: the share of positions where ``answer`` has the reversed word's letter."""
    target = word[::-1]
    answer = answer.strip().lower()
    return sum(1.0 for a, b in zip(answer, target, strict=False) if a == b) / len(target)
