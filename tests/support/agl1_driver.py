"""Run by the tests in the Agent Lightning 1.0.2 venv: AL's own ``AglRolloutManager`` against a server.

``python agl1_driver.py URL KEY MODEL LLM_ENDPOINT INPUTS_JSON OUT_JSON`` registers the model endpoint,
runs ``enqueue_and_wait_until_completed`` on the inputs (a list of ``{"question", "result"}``) with
two rollouts per sample, and writes the ``CompletedRollout`` list as JSON.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from agentlightning.verl.agl_rollout_manager import AglRolloutManager


def main() -> None:
    url, key, model, endpoint, inputs_path, out_path = sys.argv[1:7]
    inputs = json.loads(open(inputs_path).read())
    manager = AglRolloutManager(
        agl_base_url=url,
        agl_key=key,
        model=model,
        step=0,
        train_rollout_n=2,
        rollout_timeout_seconds=120,
        poll_interval_seconds=0.3,
        local_agent_class="tests.support.agl1_agents.CalcAgent",
        local_env_map={"QUESTION": "input.question", "RESULT": "input.result"},
    )
    manager.delete_model()
    manager.register_model([endpoint])
    data = {name: np.array([row[name] for row in inputs], dtype=object) for name in ("question", "result")}
    completed = manager.enqueue_and_wait_until_completed(data, is_train=True)
    with open(out_path, "w") as out:
        json.dump([c.model_dump(mode="json") for c in completed], out)


if __name__ == "__main__":
    main()
