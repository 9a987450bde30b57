"""Look-alikes of Agent Lightning's contract classes (same schema, other classes), and an agent returning them.

rollq must accept these by shape. The tests that use the real ``agentlightning``
package live in test_agentlightning.py; these run without it.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field

from rollq.worker.agent import LitAgent


class Triplet(BaseModel):
    prompt: Any
    response: Any
    reward: Optional[float] = None  # noqa: UP045  # spelled as Agent Lightning spells it
    metadata: dict[str, Any] = Field(default_factory=dict)


class Rollout(BaseModel):
    rollout_id: str
    final_reward: Optional[float] = None  # noqa: UP045
    triplets: Optional[list[Triplet]] = None  # noqa: UP045
    trace: Optional[list[dict[str, Any]]] = None  # noqa: UP045
    logs: Optional[list[str]] = None  # noqa: UP045
    metadata: dict[str, Any] = Field(default_factory=dict)


class LLM(BaseModel):
    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)


class PromptTemplate(BaseModel):
    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"]


class NotATriplet(BaseModel):
    question: str


class ForeignResultAgent(LitAgent):
    """Returns look-alike objects chosen by ``task_input["kind"]``."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        kind = task_input["kind"]
        if kind == "triplets":
            return [Triplet(prompt="p", response="r", reward=0.25)]
        if kind == "rollout":
            return Rollout(rollout_id=rollout_id, final_reward=0.5, triplets=[Triplet(prompt="p", response="r")])
        if kind == "resources":
            return float(resources["llm"].model == task_input["model"])
        return [NotATriplet(question="?")]


class PromptAgent(LitAgent):
    """Rewards 1.0 when the task ran with the prompt version its input names (an APO-like signal)."""

    def training_rollout(self, task_input: Any, rollout_id: str, resources: Any) -> Any:
        return float(resources["system_prompt"].template.startswith(task_input["want"]))
