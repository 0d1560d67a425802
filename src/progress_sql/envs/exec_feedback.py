"""``exec_feedback``: the SQL-tool agent loop of SQL-Trail (its Algorithm 1) and SkyRL-SQL.

    for t = 0..T−1 (T = env.trail_max_turns), as its Algorithm 1 counts:
        y_t ~ π(· | h)                      parsed in the ``trail`` format
        <solution> in y_t:  its SQL is the final answer; stop
        <sql> in y_t:       r = its execution; o = the result as a table with headers, or,
                            when r is invalid (an error), "Your previous action is invalid.
                            Think and try again." (lines 21-22)
        neither:            o = the same invalid-action message (Algorithm 1 appends nothing
                            here; a chat needs a user turn before the next assistant turn)
        h += <observation>o\\nYou have T − t turns left to complete the task.</observation>
                            (T before the first call, 1 after the last)
    no solution after T turns: the last observation is followed by a request for the final
    answer, and the answer to it is the last turn (T + 1 turns at most)

Every assistant message is a turn (a ``rewards.Turn``: its SQL executed and compared with the
gold, tool calls too); the episode is correct when its final turn is a ``<solution>`` whose
execution matches the gold. The observation table keeps the first ``observation_max_rows``
rows and at most ``observation_max_chars`` characters, and says when it was cut.
"""

from __future__ import annotations

from progress_sql.envs.settings import EnvSettings
from progress_sql.envs.base import Adapter, Env, StepResult
from progress_sql.envs.prompts import FINAL_ANSWER, INVALID_ACTION, TURNS_LEFT
from progress_sql.formats import parse_output
from progress_sql.rewards.types import Turn
from progress_sql.sql.result import ExecResult


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(bytes(value))} bytes>"
    return str(value).replace("\n", "\\n").replace("\r", "\\r")  # one row per line


def _clip(line: str, budget: int) -> str:
    return line if len(line) <= budget else line[: budget - 1] + "…"


def format_result(result: ExecResult, env: EnvSettings) -> str:
    """An execution as the model sees it: a ``|``-separated table under a header row, cut to
    ``env.observation_max_rows`` rows and ``env.observation_max_chars`` characters (whole
    rows; a note says how many rows are shown), or the error."""
    if not result.ok:
        return f"Error ({result.error}): {result.message}"
    lines = [" | ".join(_cell(c) for c in result.columns)]
    lines += [" | ".join(_cell(v) for v in row) for row in result.rows[: env.observation_max_rows]]
    total = f"{len(result.rows)}+" if result.truncated else str(len(result.rows))
    budget, used, shown = env.observation_max_chars, 0, 0
    if not result.rows:
        return _clip(lines[0], budget) + "\n(no rows)"
    for i, line in enumerate(lines):
        cost = len(line) + (1 if i else 0)
        if used + cost > budget:
            break
        used += cost
        shown = i  # data rows shown so far (line 0 is the header)
    if used == 0:  # even the header is too long
        table = _clip(lines[0], budget)
    else:
        table = "\n".join(lines[: shown + 1])
    if shown < len(result.rows) or result.truncated:
        return f"{table}\n(truncated: showing {shown} of {total} rows)"
    return table


def observation(content: str, turns_left: int) -> str:
    """An observation message: the content and the turns-left reminder, wrapped in tags."""
    return f"<observation>\n{content}\n{TURNS_LEFT.format(n=turns_left)}\n</observation>"


class ExecFeedbackEnv(Env):
    name = "exec_feedback"
    formats = ("trail",)
    adapter = Adapter(
        protocol="sql_tool", stem="SQLTool", recipe="sql_trail", tool="run_sql", tool_arg="action",
        tool_doc="""Take one step of the task: run a query against the database, or give the final answer.

        Args:
            action: <think>reasoning</think> followed by <sql>a query to run</sql>, or by <solution>your final query</solution>.

        Returns:
            The query's result table or its error, or a note that the final answer was recorded.
        """,
    )

    @property
    def max_turns(self) -> int:
        return self.settings.env.trail_max_turns + 1  # the tool budget T, then the forced answer

    def step(self, text: str, turn: Turn | None = None) -> StepResult:
        """Run a tool call, answer an invalid action, or end on a <solution>."""
        turn = self._begin_turn(text, turn)
        if parse_output(text, self.fmt).kind == "solution":
            return self._finish("solution", turn.correct)
        budget, taken = self.settings.env.trail_max_turns, self.episode.K
        if taken > budget:  # this was the requested final answer
            return self._finish("no_solution", False)
        valid = turn.result is not None and turn.result.ok
        content = format_result(turn.result, self.settings.env) if valid else INVALID_ACTION
        reply = observation(content, budget - (taken - 1))  # T − t, t the 0-based turn index
        if taken == budget:
            reply = f"{reply}\n{FINAL_ANSWER}"
        return self._reply(reply)
