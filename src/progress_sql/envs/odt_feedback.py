"""``odt_feedback``: multi-turn refinement with ODT feedback (progress-sql.md, Algorithm 1).

    for t = 1..T:
        y_t ~ π(· | p_t); execute y_t
        if y_t matches the gold's execution: k* = K = t; stop
        if t < T: f_t = ODT feedback on (y_t, y*); p_{t+1} = p_t + y_t + f_t
    K = T when no turn matched

The feedback f_t (a user message, Appendix F round 2+) is ODT's verbalised tag list. Two
cases have no clause-level diagnosis:

- the output holds no SQL, or its SQL does not parse (tag PARSE_ERROR): the generic fallback
  message (Appendix F's note; ``odt.FALLBACK_FEEDBACK``);
- the structure matches the gold's exactly (no tags) but the execution did not: the
  VALUE_MISMATCH message (docs/design.md, "ODT feedback text": literals are placeholders to the tree).

The tags of every wrong turn are recorded, the final one's too (for analysis: it gets no
feedback, as Algorithm 1 has none after turn T).
"""

from __future__ import annotations

from progress_sql.envs.base import Adapter, Env, StepResult
from progress_sql.odt import FALLBACK_FEEDBACK, PARSE_ERROR, VALUE_MISMATCH, diagnose, feedback_text
from progress_sql.odt.feedback import DB_ENGINE
from progress_sql.rewards.types import Turn


class ODTFeedbackEnv(Env):
    name = "odt_feedback"
    formats = ("think_sql",)
    reads_gold = True  # the feedback diagnoses the turn against the gold query
    adapter = Adapter(
        protocol="odt", stem="ODTFeedback", recipe="progress", tool="submit_answer", tool_arg="answer",
        tool_doc="""Submit one answer; it is run against the database and compared with the intended query.

        Args:
            answer: Your reasoning and SQL query, written as <think>reasoning</think><sql>query</sql>.

        Returns:
            Feedback on what to fix in the query, or a note that it is correct and the task is done.
        """,
    )

    @property
    def max_turns(self) -> int:
        return self.settings.env.max_turns  # T

    def step(self, text: str, turn: Turn | None = None) -> StepResult:
        """Score y_t; stop when correct or at T, else reply with the feedback f_t."""
        turn = self._begin_turn(text, turn)
        ep = self.episode
        if turn.correct:
            return self._finish("correct", True)
        tags, feedback = self._diagnose(turn.sql)
        ep.tags[-1] = tags
        if ep.K >= self.max_turns:
            return self._finish("max_turns", False)
        return self._reply(feedback)

    def _diagnose(self, sql: str | None) -> tuple[tuple[str, ...], str]:
        """(tags, feedback) of a wrong turn's SQL."""
        if sql is None:
            return (PARSE_ERROR,), FALLBACK_FEEDBACK.format(db_engine=DB_ENGINE)
        diagnosis = diagnose(sql, self.episode.example.gold_sql, self.settings.odt)
        if not diagnosis.parsed:
            return diagnosis.tags, FALLBACK_FEEDBACK.format(db_engine=DB_ENGINE)
        if not diagnosis.tags:
            return (VALUE_MISMATCH,), feedback_text((VALUE_MISMATCH,))
        return diagnosis.tags, diagnosis.feedback
