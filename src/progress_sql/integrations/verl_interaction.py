"""The verl interaction of every protocol (``sessions.PROTOCOLS``): the one module of the adapter
that imports verl, which verl imports when its interaction config names
``progress_sql.integrations.verl_interaction.ProtocolInteraction`` (module notes of
``progress_sql.integrations.verl``)."""

from __future__ import annotations

from typing import Any

from verl.interactions.base import BaseInteraction

from progress_sql.integrations.scoring import floor, resolve_recipe, task_settings
from progress_sql.integrations.sessions import PROTOCOLS, EpisodeSession


def _last_assistant_text(messages: Any) -> Any:
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return message.get("content")
    return None


class ProtocolInteraction(BaseInteraction):
    """A protocol's episode as a verl interaction (module notes of ``integrations.verl``).

    ``config`` (the interaction config's ``config``): ``protocol`` (default ``odt``; one of
    ``sessions.PROTOCOLS``), ``recipe`` (default the protocol's), ``max_turns`` (the turn budget;
    default the environment's), ``settings`` (the task sections as a mapping). A row's
    ``interaction_kwargs``: ``name``, ``db_path``, ``gold_sql`` and the example's columns
    (``export_parquet`` writes them).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.protocol = config.get("protocol") or "odt"
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"interaction config: unknown protocol {self.protocol!r}; known: {', '.join(PROTOCOLS)}")
        self.recipe = config.get("recipe") or PROTOCOLS[self.protocol].adapter.recipe
        self.task_settings = task_settings(config.get("settings"))
        self.max_turns = config.get("max_turns")
        self._sessions: dict[str, EpisodeSession] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = await super().start_interaction(instance_id)
        session = EpisodeSession(self.protocol, self.recipe, self.task_settings, max_turns=self.max_turns)
        columns = {k: v for k, v in kwargs.items() if k not in ("name", "db_path", "gold_sql")}
        session.start(kwargs.get("db_path"), kwargs.get("gold_sql"), **columns)
        self._sessions[instance_id] = session
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        session = self._sessions.get(instance_id)
        if session is None:  # never started: end the rollout at the floor
            recipe = resolve_recipe(self.recipe)
            scored = floor(recipe, self.task_settings, "error: interaction not started")
            return True, "", scored.total, {"reason": scored.reason}
        reply = session.step(_last_assistant_text(messages))
        scored = session.score()
        metadata = {**reply.info, "components": scored.components, "correct": scored.correct, "reason": scored.reason}
        return session.done, (reply.text if not session.done else ""), scored.total, metadata

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        session = self._sessions.get(instance_id) if instance_id is not None else None
        return session.score().total if session is not None else 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        self._sessions.pop(instance_id, None)
