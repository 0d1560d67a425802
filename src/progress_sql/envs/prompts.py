"""Every model-facing text of the rollout environments, and the round-1 chat messages.

- ``think_sql`` (Progress-SQL, one-shot): the system prompt and round-1 user prompt of
  progress-sql.md, Appendix F. The round-2+ feedback message is ODT's
  (``progress_sql.odt.feedback``: FEEDBACK_TEMPLATE, FALLBACK_FEEDBACK), not repeated here.
- ``reasoning_answer`` (Reasoning-SQL): its prompts did not survive in our copy of the paper,
  so it is the Appendix F system prompt with ``<reasoning>``/``<answer>`` as the tags.
- ``trail`` (SQL-Trail, SkyRL-SQL): a tool-use system prompt in the spirit of SQL-Trail's
  Appendix A.3 (list the tables and columns first, select only what is asked) with the
  ``<think>``/``<sql>``/``<observation>``/``<solution>`` interface, and the messages of its
  Algorithm 1: the invalid-action message, the turns-left reminder, the forced final answer.

``env.prompt_style: compact`` swaps each system prompt for a one-line one with the same tags
and protocol (and ``SchemaTexts`` renders the schema as ``- table: column, ...`` lines): the
default tiny CPU policy, trained from scratch, does not learn within its budget to read the
~800-token paper prompt, and learns to copy table and column names from the compact one. Real
models take ``paper``.

Chat messages are ``{"role": ..., "content": ...}`` dicts, as chat templates take them. The
round-1 user prompt is the same for every format (schema, optional evidence, question).
"""

from __future__ import annotations

from progress_sql.envs.settings import EnvSettings, default_task_settings
from progress_sql.corpus.records import Example
from progress_sql.odt.feedback import DB_ENGINE
from progress_sql.formats import FormatName, answer_tags

Message = dict[str, str]

# Appendix F, "System Prompt"; the two tags are the format's (think/sql for Progress-SQL).
_SINGLE_TURN_SYSTEM = (
    "Task Overview: You are a data science expert. The user message contains the database schema "
    "and the natural language question. Your task is to understand the schema and generate a valid "
    "SQL query to answer the question.\n\n"
    "Database Engine: {db_engine}\n\n"
    "Instructions:\n"
    "- Dialect Strictness: Ensure the generated SQL strictly conforms to the specific syntax and "
    "functions of the provided {db_engine}.\n"
    "- Precision: Only output the exact information asked in the question. Do not include extra "
    "columns in the SELECT clause.\n"
    "- Ambiguity Prevention: Always use short table aliases (e.g., t1, t2) and explicitly qualify all "
    "column names with their respective table aliases, especially when JOINs are involved.\n"
    "- Robustness: Consider edge cases such as handling NULL values appropriately and string matching "
    "case conventions where applicable.\n"
    "- Thinking Process: Before generating the final SQL query, step-by-step analyze the tables "
    "needed, the JOIN conditions, and the filtering criteria. Enclose your reasoning strictly within "
    "<{reason}> and </{reason}> tags.\n\n"
    "Output Format: Please strictly follow this exact output structure. Do not output any other text "
    "or markdown outside of these tags:\n"
    "<{reason}>Your step-by-step reasoning here.</{reason}>\n<{answer}>SELECT ...</{answer}>"
)

_TRAIL_SYSTEM = (
    "Task Overview: You are a data science expert. The user message contains the database schema "
    "and the natural language question. Your task is to understand the schema and write a valid SQL "
    "query that answers the question. You may explore the database with a SQL tool, within a "
    "limited number of turns.\n\n"
    "Database Engine: {db_engine}\n\n"
    "Instructions:\n"
    "- Schema Selection: In your first <think> block, list the tables and columns from the schema "
    "that you plan to use. Do not use tables or columns that are not in the schema.\n"
    "- Precision: The final SELECT clause must contain only the columns the question asks for, "
    "nothing more and nothing missing.\n"
    "- Dialect Strictness: Ensure every query strictly conforms to the syntax and functions of "
    "{db_engine}.\n\n"
    "Format:\n"
    "- Reason inside <think>...</think> every time you receive new information.\n"
    "- To run a query, end your response with exactly one query inside <sql>...</sql>. Its result, "
    "a table with a header row (at most {max_rows} rows), or its error comes back inside "
    "<observation>...</observation>. Never write <observation> yourself.\n"
    "- You can call the tool at most {max_turns} times. When no further exploration is needed, or "
    "when you run out of turns, give your final SQL query inside <solution>...</solution> instead.\n\n"
    "Every response is exactly <think>your reasoning</think> followed by either <sql>a query to "
    "run</sql> or <solution>your final SQL query</solution>."
)

# env.prompt_style: compact (the tiny CPU policy): the same tags and protocol in one line.
_COMPACT_SYSTEM = ("Write one {db_engine} query for the question. "
                   "Output <{reason}>reasoning</{reason}> then <{answer}>SQL</{answer}>.")
_COMPACT_TRAIL_SYSTEM = (
    "Answer the question with one {db_engine} query. You may run up to {max_turns} queries, each as "
    "<think>reasoning</think><sql>query</sql>; its result comes back in <observation>. Finish with "
    "<think>reasoning</think><solution>final query</solution>."
)

# Appendix F, "User Prompt — Round 1" (BIRD-style evidence, when an example has it, goes
# before the question, as OmniSQL's and SkyRL-SQL's prompts place "External Knowledge").
_ROUND1_USER = (
    "Database Schema:\n{db_details}\n"
    "This schema describes the database's structure, including tables, columns, primary keys, "
    "foreign keys, and any relevant relationships or constraints.\n\n"
    "{evidence}Question:\n{question}"
)
_EVIDENCE = "External Knowledge:\n{evidence}\n\n"

# SQL-Trail, Algorithm 1 (lines 22 and 26) and its final-answer step (line 31).
INVALID_ACTION = "Your previous action is invalid. Think and try again."
TURNS_LEFT = "You have {n} turns left to complete the task."
FINAL_ANSWER = (
    "You have used all your SQL tool calls. Do not call the tool again: based on what you have seen, "
    "put your reasoning inside <think>...</think>, then your final SQL query inside "
    "<solution>...</solution>."
)

def system_prompt(fmt: FormatName, env: EnvSettings | None = None, db_engine: str = DB_ENGINE) -> str:
    """The system prompt for outputs in format ``fmt``; ``env`` gives the prompt style and the
    tool budget (trail)."""
    env = env or default_task_settings().env
    compact = env.prompt_style == "compact"
    if fmt == "trail":
        template = _COMPACT_TRAIL_SYSTEM if compact else _TRAIL_SYSTEM
        return template.format(db_engine=db_engine, max_turns=env.trail_max_turns, max_rows=env.observation_max_rows)
    try:
        reason, answer = answer_tags(fmt)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    return (_COMPACT_SYSTEM if compact else _SINGLE_TURN_SYSTEM).format(db_engine=db_engine, reason=reason,
                                                                         answer=answer)


def user_prompt(example: Example, db_details: str) -> str:
    """The round-1 user message: schema DDL, evidence (when the example has any), question."""
    evidence = _EVIDENCE.format(evidence=example.evidence.strip()) if example.evidence.strip() else ""
    return _ROUND1_USER.format(db_details=db_details.strip(), evidence=evidence, question=example.question.strip())


def round1_messages(
    example: Example, db_details: str, fmt: FormatName, env: EnvSettings | None = None
) -> list[Message]:
    """``[system, user]``: the conversation every rollout starts from."""
    return [
        {"role": "system", "content": system_prompt(fmt, env)},
        {"role": "user", "content": user_prompt(example, db_details)},
    ]
