"""From batches of rollouts to what a trainer turns into tensors: plain lists, no torch at import.

:func:`triplet_samples` gives one :class:`TokenSample` per LLM call, :func:`rollout_samples` one per rollout
(multi-turn calls joined, with the tokens the model did not sample masked out), and :func:`pad` the padded
columns (prompt ids left-padded, responses right-padded) that VERL, OpenRLHF and TRL build their tensors from.
``docs/training.md`` shows the few lines for each.
"""

from .samples import PaddedColumns, TokenSample, pad, rollout_samples, triplet_samples

__all__ = ["PaddedColumns", "TokenSample", "pad", "rollout_samples", "triplet_samples"]
