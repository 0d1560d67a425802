"""The SkyRL-gym text environment of every protocol (``skyrl_gym.ENV_IDS``): the one module of
the adapter that imports ``skyrl_gym``, which SkyRL imports when it makes an environment of an
id that ``progress_sql.integrations.skyrl_gym.register`` registered (module notes there)."""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from progress_sql.integrations.sessions import EpisodeSession
from progress_sql.integrations.skyrl_gym import plain, row_columns


class ProtocolTextEnv(BaseTextEnv):
    """A protocol's episode as a SkyRL-gym text environment; ``protocol`` comes from the
    registration (``skyrl_gym.register``'s kwargs), ``env_config`` and ``extras`` from SkyRL."""

    def __init__(self, env_config: Any = None, extras: Any = None, *, protocol: str = "odt") -> None:
        super().__init__()
        config, extras = plain(env_config) or {}, plain(extras) or {}
        self.session = EpisodeSession(protocol, config.get("recipe"), config.get("settings"),
                                      max_turns=extras.get("max_turns"))
        columns = row_columns(extras)
        self.first_prompt = self.session.start(columns.pop("db_path"), columns.pop("gold_sql"), **columns)
        self.max_turns = self.session.max_turns

    def init(self, prompt: Any) -> tuple[list, dict[str, Any]]:
        """The dataset's prompt (the environment's round-1 messages when it has none)."""
        return (prompt if prompt else self.first_prompt), {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reply = self.session.step(action)
        self.turns += int(reply.counted)
        if not reply.done:
            return BaseTextEnvStepOutput(observations=[{"role": "user", "content": reply.text}],
                                         reward=0.0, done=False, metadata=reply.info)
        scored = self.session.score()
        return BaseTextEnvStepOutput(
            observations=[], reward=scored.total, done=True,
            metadata={**reply.info, "components": scored.components, "correct": scored.correct,
                      "turns": scored.turns, "reason": scored.reason, "recipe": self.session.recipe.name},
        )

    def get_metrics(self) -> dict[str, Any]:
        scored = self.session.score()
        return {"correct": float(scored.correct), "turns": scored.turns, "floored": float(scored.floored),
                **scored.components}
