"""The per-episode training record: an episode rolled out with a ``TokenPolicy`` (its token
record in ``Episode.tokens``) as the token ids, loss mask and sampler log-probabilities the
trainer consumes."""

from __future__ import annotations

from dataclasses import dataclass

from progress_sql.params import GenerationSettings
from progress_sql.envs.base import Episode
from progress_sql.inference.policy import ConversationTokens


@dataclass
class TokenizedTrajectory:
    """One episode as the trainer consumes it. ``old_logprobs`` are the sampler's per-token
    log-probabilities (0.0 where ``loss_mask`` is 0); ``truncated``: cut to the length limit."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    reward: float
    group_id: int
    turn_count: int
    truncated: bool = False

    @property
    def sampled_tokens(self) -> int:
        return int(sum(self.loss_mask))


def max_sequence_tokens(gen: GenerationSettings, max_turns: int) -> int:
    """The length limit of a trajectory: prompt budget + T generations."""
    return gen.max_prompt_tokens + max_turns * gen.max_new_tokens


def tokenized_trajectory(episode: Episode, reward: float, group_id: int, max_tokens: int) -> TokenizedTrajectory:
    """The training record of ``episode`` from its token record (``Episode.tokens``, a
    ``TokenPolicy``'s), cut to ``max_tokens`` (input ids, mask and log-probs together)."""
    conv: ConversationTokens | None = episode.tokens
    if conv is None:
        raise ValueError(f"episode {episode.id} has no token record: roll it out with a TokenPolicy "
                         "(ChatModel.policy)")
    n = min(len(conv.input_ids), max_tokens)
    return TokenizedTrajectory(
        input_ids=conv.input_ids[:n],
        loss_mask=conv.loss_mask[:n],
        old_logprobs=conv.logprobs[:n],
        reward=float(reward),
        group_id=int(group_id),
        turn_count=episode.K,
        truncated=n < len(conv.input_ids),
    )
