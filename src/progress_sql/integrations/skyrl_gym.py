"""SkyRL-gym (PyPI ``skyrl-gym``): the multi-turn protocols as text environments.

    from progress_sql.integrations import skyrl_gym as progress_envs
    progress_envs.register()                     # ids progress-sql-odt, progress-sql-sql-tool
    env = skyrl_gym.make("progress-sql-odt", env_config={...}, extras=row)

One id per protocol (``sessions.PROTOCOLS``): ``progress-sql-odt`` (Algorithm 1, recipe
``progress``) and ``progress-sql-sql-tool`` (the SQL tool loop, recipe ``sql_trail``), each an
instance of ``skyrl_text_env.ProtocolTextEnv``, a subclass of SkyRL-gym's ``BaseTextEnv``, to
which the registration passes its protocol. ``step(action)`` returns its ``BaseTextEnvStepOutput``: the environment's
reply as ``observations`` (one user message, none when done), ``reward`` 0.0 until the episode
ends and then the recipe's reward of the whole episode, ``done``, and ``metadata`` (the turn's
diagnostics; at the end the reward's components, ``correct`` and ``reason``).

Constructor arguments, as SkyRL's generator passes them:

- ``extras`` (the dataset row): the gold query as ``reward_spec.ground_truth`` (or
  ``gold_sql``), the database as ``db_path`` (top level or in ``extra_info``), optionally
  ``db_id``, ``question``, ``difficulty``, ``evidence``, ``example_id`` (same places), and
  ``max_turns`` (SkyRL's ``generator.max_turns``: T of Algorithm 1, the SQL tool budget);
- ``env_config``: ``recipe`` (a recipe of the protocol's output format) and ``settings`` (the
  task sections as a mapping, e.g. ``{"sandbox": {"timeout_s": 5}}``; default the built-in).

Bad input never raises: a missing database or gold makes the first step end the episode with
the recipe's floor reward and ``metadata["reason"]``. ``skyrl_gym`` is imported by ``register``
and by the class's module, which SkyRL imports when it makes an environment.
"""

from __future__ import annotations

from typing import Any

from progress_sql.integrations.sessions import PROTOCOLS
from progress_sql.integrations.tasks import task_rows

ENV_IDS = {f"progress-sql-{protocol.replace('_', '-')}": protocol for protocol in PROTOCOLS}  # env id -> protocol
# The one class of every id (its module imports skyrl_gym); the registration passes the protocol.
ENTRY_POINT = "progress_sql.integrations.skyrl_text_env:ProtocolTextEnv"


def register() -> None:
    """Register every environment with ``skyrl_gym`` under ``ENV_IDS`` (again: no-op)."""
    import skyrl_gym  # noqa: PLC0415 - the framework is imported only when used

    for env_id, protocol in ENV_IDS.items():
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=ENTRY_POINT, kwargs={"protocol": protocol})


def plain(value: Any) -> Any:
    """A config value (OmegaConf ``DictConfig``/``ListConfig`` included) as dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def row_columns(extras: dict[str, Any]) -> dict[str, Any]:
    """The example's columns from a SkyRL row: top level first, then ``extra_info``."""
    info = extras.get("extra_info") if isinstance(extras.get("extra_info"), dict) else {}
    spec = extras.get("reward_spec") if isinstance(extras.get("reward_spec"), dict) else {}
    names = ("db_path", "db_id", "question", "difficulty", "evidence", "example_id")
    columns = {name: extras.get(name, info.get(name, "")) for name in names}
    columns["gold_sql"] = spec.get("ground_truth", extras.get("gold_sql", info.get("gold_sql")))
    return columns


def dataset_rows(corpus_dir: str, split: str = "train", env_id: str = "progress-sql-odt", recipe: str | None = None,
                 settings: Any = None, *, limit: int | None = None) -> list[dict[str, Any]]:
    """SkyRL's dataset rows for ``env_id``: ``data_source``, ``prompt`` (the environment's
    round-1 messages), ``env_class``, ``reward_spec`` (rule, gold) and ``extra_info`` (the
    database path and the example's columns); write them with ``datasets`` or pandas to
    the parquet files ``data.train_data`` names."""
    env = PROTOCOLS[ENV_IDS[env_id]]
    rows = []
    for index, row in enumerate(task_rows(corpus_dir, split, recipe or env.adapter.recipe, settings, env=env.name,
                                          limit=limit)):
        rows.append({
            "data_source": "progress_sql",
            "prompt": row["prompt"],
            "env_class": env_id,
            "reward_spec": {"method": "rule", "ground_truth": row["gold_sql"]},
            "extra_info": {**{k: v for k, v in row.items() if k not in ("prompt", "gold_sql")},
                           "split": split, "index": index},
        })
    return rows
