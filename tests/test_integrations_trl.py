"""The TRL adapter against the installed trl 1.16: reward functions with TRL's signature, real
``GRPOTrainer`` runs of two steps on the project's tiny model (the docs' single-turn and
multi-turn scripts, docs/integrations/trl.md), and a multi-turn run whose turns are scripted, so
that TRL's own tool loop, masking and reward logging can be checked against the recipe."""

from __future__ import annotations

import inspect
import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import get_json_schema  # noqa: E402

from progress_sql import envs, rewards  # noqa: E402
from progress_sql.integrations import trl as trl_adapter  # noqa: E402
from progress_sql.integrations.tasks import ROW_COLUMNS, example_from_row  # noqa: E402
from conftest import answer  # noqa: E402
from corpora import small_corpus  # noqa: E402
from doc_blocks import python_blocks, run_doc_block  # noqa: E402

TINY_MODEL = {"vocab_size": 1024, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 64, "copy_warmup": {"steps": 0}}
SMOKE = {"MAX_STEPS": "2", "NUM_GENERATIONS": "2", "MAX_COMPLETION_LENGTH": "16"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(corpus, model folder): a generated corpus and the untrained tiny policy, its tokenizer
    given TRL's Qwen2.5 chat template (ChatML with tool calls), which TRL's tool loop needs."""
    from trl.chat_template_utils import qwen2_5_chat_template

    from progress_sql.params import settings_from_dict
    from progress_sql.train.tiny import build_tiny_model

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("trl")
    corpus = small_corpus(root / "corpus")
    model = build_tiny_model(corpus, settings_from_dict({"model": TINY_MODEL}), root / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(model)
    return corpus, model


def _history(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


# ----------------------------------------------------------------------------- signatures
def test_reward_functions_have_trls_signature(tiny):
    corpus, _ = tiny
    for recipe in ("progress", "oneshot", "reasoning_sql"):
        reward = trl_adapter.reward_function(recipe)
        assert reward.__name__ == f"progress_sql_{recipe}"
        params = inspect.signature(reward).parameters
        assert list(params)[:4] == ["prompts", "completions", "db_path", "gold_sql"]
        assert params["columns"].kind is inspect.Parameter.VAR_KEYWORD
        data = trl_adapter.dataset(corpus, "train", recipe, limit=4)
        assert set(ROW_COLUMNS) <= set(data.column_names)
        rows = data.to_list()
        rows.append(rows[0])  # its completion has no tags
        completions = [[{"role": "assistant", "content": answer(r["gold_sql"], rewards.get(recipe).fmt)}]
                       for r in rows[:-1]] + ["no tags"]
        columns = {k: [r[k] for r in rows] for k in data.column_names if k != "prompt"}
        logged = {}
        values = reward([r["prompt"] for r in rows], completions, **columns,
                        log_metric=lambda name, value: logged.setdefault(name, value))
        floor = rewards.get(recipe).min_reward()
        assert values[-1] == floor and all(v > floor for v in values[:-1])
        assert set(logged) == {f"progress_sql_{recipe}/{c}" for c in (*rewards.get(recipe).components, "floored")}
        assert logged[f"progress_sql_{recipe}/floored"] == pytest.approx(1 / len(values))


def test_environment_tools_have_schemas_trl_can_build():
    odt, tool = trl_adapter.ODTFeedbackEnvironment(), trl_adapter.SQLToolEnvironment()
    public = lambda env: sorted(n for n, m in inspect.getmembers(type(env), inspect.isfunction)  # noqa: E731
                                if not n.startswith("_"))
    assert public(odt) == ["reset", "submit_answer"] and public(tool) == ["reset", "run_sql"]
    for method, arg in ((odt.submit_answer, "answer"), (tool.run_sql, "action")):
        schema = get_json_schema(method)["function"]
        assert schema["parameters"]["required"] == [arg] and schema["parameters"]["properties"][arg]["type"] == "string"


def test_the_written_out_environment_classes_are_those_of_the_registered_protocols():
    """The classes are written out (grep and go-to-definition find them); this fails until
    ``python -m progress_sql.integrations.trl`` rewrites them after a protocol changes."""
    written = trl_adapter.written_source(inspect.getsource(trl_adapter))
    assert written == trl_adapter.environment_classes_source(), "run: python -m progress_sql.integrations.trl"
    assert set(trl_adapter.ENVIRONMENTS) == set(envs.protocols())
    for protocol, cls in trl_adapter.ENVIRONMENTS.items():
        adapter = envs.protocols()[protocol].adapter
        assert (cls.__name__, cls.protocol) == (f"{adapter.stem}Environment", protocol)
        assert inspect.getdoc(getattr(cls, adapter.tool)) == inspect.cleandoc(adapter.tool_doc)


def test_reasoning_content_is_put_back_before_scoring():
    message = {"role": "assistant", "content": "<sql>SELECT 1</sql>", "reasoning_content": "because"}
    assert trl_adapter.completion_text([message]) == "<think>because</think><sql>SELECT 1</sql>"
    assert trl_adapter.completion_text("plain") == "plain" and trl_adapter.completion_text(None) == ""


# ----------------------------------------------------------------------------- real runs
@pytest.mark.slow
def test_docs_single_turn_script_trains_two_steps(tiny, tmp_path, monkeypatch):
    corpus, model = tiny
    (code,) = [b for b in python_blocks("docs/integrations/trl.md") if "train_trl.py" in b]
    ns = run_doc_block(code, "docs/integrations/trl.md", monkeypatch,
                       {"CORPUS": str(corpus), "MODEL": str(model), "OUT": str(tmp_path), **SMOKE})
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2
    means = _history(trainer, "rewards/progress_sql_progress/mean")
    assert len(means) == 2 and all(math.isfinite(m) for m in means)
    assert len(_history(trainer, "progress_sql_progress/floored")) == 2


@pytest.mark.slow
def test_docs_multi_turn_script_trains_two_steps(tiny, tmp_path, monkeypatch):
    corpus, model = tiny
    (code,) = [b for b in python_blocks("docs/integrations/trl.md") if "train_trl_odt.py" in b]
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    ns = run_doc_block(code, "docs/integrations/trl.md", monkeypatch,
                       {"CORPUS": str(corpus), "MODEL": str(model), "OUT": str(tmp_path), **SMOKE})
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2
    means = _history(trainer, "rewards/progress_sql_episode/mean")
    assert len(means) == 2 and all(math.isfinite(m) for m in means)
    assert len(_history(trainer, "tools/call_frequency")) == 2  # TRL ran its tool loop


def _tool_call(answer_text: str) -> str:
    call = {"name": "submit_answer", "arguments": {"answer": answer_text}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"


@pytest.mark.slow
def test_scripted_odt_rollouts_are_masked_by_trl_and_rewarded_as_the_recipe(tiny, tmp_path, monkeypatch):
    """Every rollout: a wrong answer through the tool, the gold through the tool, then a plain
    message. TRL parses the calls, runs the environment, masks its feedback; the logged reward
    is the progress recipe's on the project environment's trajectory of the same two turns."""
    from trl import GRPOConfig, GRPOTrainer

    corpus, model = tiny
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    data = trl_adapter.dataset(corpus, "train", protocol="odt", limit=1)
    row = data.to_list()[0]
    turns = [answer("SELECT 1"), answer(row["gold_sql"])]
    script = [_tool_call(turns[0]), _tool_call(turns[1]), "Done.<|im_end|>"]
    tokenizer = AutoTokenizer.from_pretrained(model)

    config = GRPOConfig(output_dir=str(tmp_path), max_steps=2, num_generations=2, per_device_train_batch_size=2,
                        max_completion_length=1024, max_tool_calling_iterations=4, beta=0.0, logging_steps=1,
                        bf16=False, report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = GRPOTrainer(model=str(model), reward_funcs=trl_adapter.episode_reward, args=config, train_dataset=data,
                          environment_factory=trl_adapter.ODTFeedbackEnvironment)

    def scripted_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # the scripted policy: the next output of the script, by the tool results already seen
        texts = [script[tokenizer.decode(ids).count("<tool_response>")] for ids in prompt_ids]
        return [tokenizer.encode(text, add_special_tokens=False) for text in texts], None

    batches = []
    generate_and_score = trainer._generate_and_score_completions

    def recording(inputs):
        batches.append(generate_and_score(inputs))
        return batches[-1]

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted_turn)
    monkeypatch.setattr(trainer, "_generate_and_score_completions", recording)
    trainer.train()

    reference = envs.get("odt_feedback")()
    reference.reset(example_from_row(row["gold_sql"], **{k: row[k] for k in ("db_id", "question", "difficulty",
                                                                             "evidence", "example_id")}),
                    row["db_path"])
    for text in turns:
        reference.step(text)
    expected = rewards.get("progress")(reference.episode.trajectory())
    assert reference.episode.k_star == 2
    assert _history(trainer, "rewards/progress_sql_episode/mean") == pytest.approx([expected.total] * 2)
    assert _history(trainer, "tools/call_frequency") == [2.0, 2.0]
    assert _history(trainer, "progress_sql_episode/late") == pytest.approx([expected.components["late"]] * 2)
    feedback = reference.episode.messages[3]["content"]  # the ODT feedback on turn 1
    for batch in batches:
        for ids, mask, tool in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
            model_text = tokenizer.decode(ids[(mask * tool).bool()])
            env_text = tokenizer.decode(ids[(mask * (1 - tool)).bool()])
            assert feedback in env_text and trl_adapter.CORRECT in env_text  # TRL masked the environment's text
            assert "<tool_call>" in model_text and "Done." in model_text and feedback not in model_text
    assert all(env.session.turns == 2 and env.session.score().correct for env in trainer.environments)
