"""The settings of params.yaml as typed sections: the one home of every tunable number.

The defaults below are the project's defaults (``docs/design.md``); params.yaml lists every
one of them explicitly (a test keeps the two in sync). Unknown keys, wrong types and
out-of-range values are errors that name the key. Each package owns its own section
(``progress_sql.sections``); this module holds the rest and composes the root ``Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Callable, Literal

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from progress_sql import envs, rewards, sources
from progress_sql.corpus.records import CORPUS_SPLITS, INDOMAIN
from progress_sql.envs.settings import EnvSettings
from progress_sql.inference.settings import AUTO, BACKENDS, GenerationSettings
from progress_sql.odt.settings import ODTSettings
from progress_sql.rewards.registry import RewardSettings
from progress_sql.sections import Conflict
from progress_sql.sections import Section as _Section
from progress_sql.sql.hardness import HARDNESS_LEVELS
from progress_sql.sql.settings import SandboxSettings


class SettingsError(ValueError):
    """params.yaml (or an override) is missing, malformed or out of range."""


def _registered(kind: str, name: str, known: tuple[str, ...]) -> str:
    if name not in known:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(known)}")
    return name


@dataclass(frozen=True)
class Registered:
    """A setting whose values are names of a registry: checked against the registry when loaded,
    and documented by the registry's name (docs/CONFIG.md, params.yaml's comments), never by a
    copy of its names, so that a new part changes neither."""

    what: str  # what the setting takes, naming the registry: docs/CONFIG.md's type
    names: Callable[[], tuple[str, ...]]  # the names it accepts, read from the registry
    default: str = ""  # docs/CONFIG.md's default when the registry derives it ("": the value itself)
    meaning: str = ""  # docs/CONFIG.md's meaning where params.yaml leaves a derived default out


def registered_settings() -> dict[str, Registered]:
    """The settings that name registered parts (tests/test_registries.py checks them by the
    registry they name)."""
    return {
        "generation.backend": Registered("auto, or a backend of `inference.settings.BACKENDS`",
                                         lambda: (AUTO, *BACKENDS)),
        "rl.recipe": Registered("a recipe of `rewards.registry.RECIPES`", rewards.names),
        "rl.env": Registered("an environment of the `envs` registry", envs.names),
        "rl.algorithm": Registered("an algorithm of `params.ALGORITHMS`", lambda: tuple(ALGORITHMS)),
        "rl.loss_aggregation": Registered("auto, or an aggregation of `params.settings.AGGREGATIONS`",
                                          lambda: ("auto", *AGGREGATIONS)),
        "eval.multi_turn_env": Registered("an environment of the `envs` registry whose feedback does not read the gold",
                                          lambda: tuple(n for n in envs.names() if not envs.get(n).reads_gold)),
        "eval.splits": Registered("splits of `corpus.records.CORPUS_SPLITS` and variants of `sources.VARIANTS`",
                                  lambda: EVAL_SPLITS, default="indomain, dev, test, then every variant"),
        "data.import_train": Registered("sources of `sources.SOURCES` that have a train set", lambda: _TRAIN_SOURCES,
                                        default="all of them", meaning="of the datasets given: those whose train "
                                        "sets the train split is drawn from"),
        "data.import_eval": Registered("sources of `sources.SOURCES` that have dev/test sets", lambda: _EVAL_SOURCES,
                                       default="all of them", meaning="of the datasets given: those whose dev (and "
                                       "test) sets make the dev and test splits"),
    }


def derived_settings() -> set[str]:
    """The settings whose default the registry derives (every source, every split): optional in
    params.yaml, so a new part is taken by default without a second list to keep in step there
    (a preset or params.yaml may still set one)."""
    return {key for key, registered in registered_settings().items() if registered.default}


def registered_names() -> dict[str, tuple[str, ...]]:
    """The settings that name registered parts, and the names each accepts."""
    return {key: registered.names() for key, registered in registered_settings().items()}


def part_settings() -> dict[str, str]:
    """The settings that belong to a registered part, by dotted key or section, with the registry:
    a recipe's weights, a backend's section, a dataset source's folder and share. Each is optional
    in params.yaml (its default is its module's), so a new part needs no line there; docs/CONFIG.md
    lists those params.yaml lists."""
    return {
        **{f"rewards.{name}": "rewards.registry.RECIPES" for name in rewards.names()},
        **{f"generation.{name}": "inference.settings.BACKENDS" for name in BACKENDS},
        **{f"data.{s.setting}": "sources.SOURCES" for s in sources.SOURCES},
        **{f"data.mix.{s.name}": "sources.SOURCES" for s in sources.with_train()},
    }


# ----------------------------------------------------------------------------- data
# The dataset sources an import reads come from their registry (progress_sql.sources): each
# gives its setting data.import_<name>, and those with a train set (with dev/test sets) are the
# choices of data.import_train (data.import_eval) and have a share in data.mix.
_TRAIN_SOURCES = tuple(s.name for s in sources.with_train())
_EVAL_SOURCES = tuple(s.name for s in sources.with_evaluation())

MixRatios = create_model(
    "MixRatios", __base__=_Section,
    __doc__="Fixed shares of an imported training set (``data.import_sampling: shares``) drawn from the given "
            "datasets' train sets; renormalised over the datasets given.",
    **{s.name: (float, Field(s.share, ge=0.0)) for s in sources.with_train()},
)


# How the words of a bundled database's names join (data.naming): release_year, releaseYear,
# ReleaseYear, RELEASE_YEAR, Release_year.
NAMING_CASES = ("snake", "camel", "pascal", "upper", "capitalised")


class HardnessMix(_Section):
    """Target shares of Spider hardness levels in each bundled split (normalised when drawn);
    the defaults are Spider dev's (248 easy, 446 medium, 174 hard, 166 extra of 1,034)."""

    easy: float = Field(0.24, ge=0.0)
    medium: float = Field(0.43, ge=0.0)
    hard: float = Field(0.17, ge=0.0)
    extra: float = Field(0.16, ge=0.0)

    @model_validator(mode="after")
    def _positive_total(self) -> "HardnessMix":
        if sum(self.model_dump().values()) <= 0:
            raise ValueError("data.hardness_mix: the shares must not all be zero")
        return self


class _DataSettings(_Section):
    seed: int = Field(0, ge=0)
    out_dir: str = "data/corpus"
    n_databases: int = Field(8, ge=3)
    n_dev_databases: int = Field(2, ge=1)
    n_test_databases: int = Field(2, ge=1)
    train_size: int = Field(2000, ge=1)
    dev_size: int = Field(400, ge=1)
    test_size: int = Field(400, ge=1)
    # Unseen questions on the train databases (indomain.jsonl; an import writes none); 0: none
    indomain_size: int = Field(200, ge=0)
    neighbours: int = Field(5, ge=0, le=50)
    max_empty_gold_share: float = Field(0.05, ge=0.0, le=1.0)
    gold_timeout_s: float = Field(2.0, gt=0.0)
    mix_total: int = Field(20_000, ge=1)
    mix: MixRatios = MixRatios()
    # Bundled corpus (progress_sql.data.build): rows, hardness, empty golds, evidence, fuzzing.
    rows_scale: float = Field(1.0, gt=0.0, le=20.0)  # × each table's catalogue row range
    hardness_mix: HardnessMix = HardnessMix()
    empty_gold_share: float = Field(0.02, ge=0.0, le=1.0)  # empty-result golds the build keeps
    evidence_share: float = Field(0.3, ge=0.0, le=1.0)  # DK-phrased with evidence, where a rule applies
    fuzz_keep: float = Field(0.5, ge=0.0, le=1.0)  # neighbour values kept from the original row
    fuzz_rows: float = Field(0.2, ge=0.0, le=0.9)  # neighbour row count within ±this share
    renamed_copies: int = Field(0, ge=0, le=20)  # renamed copies of each train database (data.domains.renaming)
    renamed_column_share: float = Field(0.5, ge=0.0, le=1.0)  # value columns a copy renames
    # How a bundled database spells its names and values (data.naming, data.mess): the word
    # cases drawn from per database, the share of databases with messy values, and how often a
    # question uses a table's or column's own schema word rather than a synonym or an implicit wording.
    naming_styles: list[Literal[NAMING_CASES]] = Field(default_factory=lambda: list(NAMING_CASES), min_length=1)
    messy_share: float = Field(0.5, ge=0.0, le=1.0)
    schema_word_share: float = Field(0.6, ge=0.0, le=1.0)
    # data validate: a bundled corpus fails when more of its questions name every table of their gold
    max_tables_named_share: float = Field(0.7, ge=0.0, le=1.0)
    # Where the corpus comes from: bundled (generated from data.seed) or import (datasets on disk,
    # progress_sql.data.importing). An import reads the folders data.import_<source> name ("": not
    # given; one per registered source, added below), read-only.
    source: Literal["bundled", "import"] = "bundled"
    # test-suite databases <db_id>/*.sqlite for TS; "": <import_spider>/test_suite_database if present
    import_test_suite: str = ""
    # of those given: the train sets drawn from
    import_train: list[Literal[_TRAIN_SOURCES]] = list(_TRAIN_SOURCES)
    import_eval: list[Literal[_EVAL_SOURCES]] = list(_EVAL_SOURCES)  # of those given: dev/test sets that make dev and test
    # random: data.mix_total examples drawn uniformly from the union of the train sets (the paper);
    # shares: data.mix fixed shares of data.mix_total. Both seeded by data.seed.
    import_sampling: Literal["random", "shares"] = "random"
    import_databases: Literal["copy", "symlink"] = "copy"  # symlink: no copies of large databases (BIRD)
    # the share of imported golds that may fail on their database; above it the import fails
    max_failing_gold_share: float = Field(0.05, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _splits_fit(self) -> "DataSettings":
        if self.n_dev_databases + self.n_test_databases >= self.n_databases:
            raise Conflict("data.n_databases must exceed data.n_dev_databases + data.n_test_databases",
                           "data.n_databases", "data.n_dev_databases", "data.n_test_databases")
        if self.empty_gold_share > self.max_empty_gold_share:
            raise Conflict("data.empty_gold_share must not exceed data.max_empty_gold_share",
                           "data.empty_gold_share", "data.max_empty_gold_share")
        if self.source == "import" and not any(getattr(self, s.setting) for s in sources.datasets()):
            raise Conflict(f"data.source is import: set {sources.dataset_settings()} to a dataset folder", "data.source")
        return self


DataSettings = create_model(
    "DataSettings", __base__=_DataSettings,
    **{s.setting: (str, Field("", description=s.about)) for s in sources.SOURCES},
)


# ----------------------------------------------------------------------------- model and training
class CopyWarmupSettings(_Section):
    """Copy pretraining of the untrained tiny model (``train.tiny.copy_warmup``): random token
    strings, each followed by itself, with loss on the repeat. A from-scratch model learns
    table and column names by heart; once it can copy (an induction head), SFT teaches it to
    copy names from the schema in the prompt, so it can answer on databases it has not seen."""

    steps: int = Field(0, ge=0)  # at most (0: off; cpu-long: 3000, ~0.27 s a step on 2 CPU threads)
    target_loss: float = Field(0.3, ge=0.0)  # stop once the mean loss of the last 50 steps is below (0: run all steps)
    lr: float = Field(2e-3, gt=0.0)
    batch_size: int = Field(32, ge=1)
    grad_clip: float = Field(1.0, gt=0.0)  # max gradient norm
    max_len: int = Field(32, ge=2)  # a string has 8..max_len tokens (fewer when max_len < 8)


class ModelSettings(_Section):
    """The tiny policy the project builds for CPU runs (a Qwen2/Llama-style config and a BPE
    tokenizer trained on the corpus). Real models are loaded from a path or hub id instead."""

    base_dir: str = "outputs/tiny-base"  # where `train init` writes the tiny model (before SFT)
    # A pretrained policy to start from instead of the tiny one: a bundled model's name (smollm2),
    # a model folder or a hub id. `train init` then saves it in base_dir as a plain model folder
    # (fp32), which DVC tracks and SFT starts from; the tiny-model settings below are not used.
    pretrained: str = ""
    arch: Literal["qwen2", "llama"] = "qwen2"
    vocab_size: int = Field(1024, ge=256, le=262_144)
    hidden_size: int = Field(256, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(768, ge=16)
    max_position_embeddings: int = Field(2048, ge=128)
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    copy_warmup: CopyWarmupSettings = CopyWarmupSettings()


class LoRASettings(_Section):
    """LoRA adapters through peft (``train.lora``): the base weights frozen, the adapters trained."""

    enabled: bool = False
    r: int = Field(16, ge=1)  # adapter rank
    alpha: int = Field(32, ge=1)  # scale alpha / r
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    # the modules that get adapters: all-linear (every linear layer but the output head) or their names
    targets: Literal["all-linear"] | list[str] = "all-linear"


class RLLoRASettings(LoRASettings):
    """``rl.lora``: as ``sft.lora``, without dropout: a rollout samples in eval mode and the update
    must see the same function (the ratio of the first pass is then exactly 1)."""

    dropout: float = Field(0.0, ge=0.0, le=0.0)


class OwnMistakesSettings(_Section):
    """``sft.own_mistakes``: a second SFT pass on revision dialogues built from the policy's OWN
    wrong answers (RISE, SCoRe: a second turn learns to revise from the first turn's real
    mistakes, not from corruptions it never makes). After the plain pass, the trained policy
    answers ``questions`` train questions ``samples`` times each (``generation.*``, as an RL
    episode's first turn); each wrong answer, the ODT feedback the environment gives it and
    the gold make a dialogue whose final turn is the target (``train.sft``)."""

    questions: int = Field(0, ge=0)  # train questions answered after the plain pass; 0: off
    samples: int = Field(4, ge=1)  # answers each; wrong ones become dialogues
    per_question: int = Field(1, ge=1)  # distinct wrong answers kept a question
    epochs: float = Field(1.0, gt=0.0)  # passes over the second pass's conversations
    lr_scale: float = Field(0.5, gt=0.0, le=10.0)  # its peak learning rate: this times sft.lr
    # plain examples mixed in per dialogue, so the first turn keeps being trained (SCoRe: a second
    # turn trained alone drags the first away from the SFT policy)
    replay: float = Field(1.0, ge=0.0, le=10.0)


class SFTSettings(_Section):
    init_from: str = "outputs/tiny-base"  # model to fine-tune (path or hub id)
    out_dir: str = "outputs/sft"
    epochs: float = Field(4.0, gt=0.0)
    lr: float = Field(2e-3, gt=0.0)
    batch_size: int = Field(8, ge=1)  # conversations per step, drawn from one database
    max_seq_len: int = Field(1536, ge=32)  # longer conversations are dropped, not truncated
    weight_decay: float = Field(0.0, ge=0.0)
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, gt=0.0)  # max gradient norm
    max_minutes: float = Field(0.0, ge=0.0)  # training-loop wall-clock budget; 0: none
    revision_share: float = Field(0.3, ge=0.0, le=1.0)  # examples also given as a revision dialogue
    copy_rows: int = Field(0, ge=0)  # random copy strings added to each step's loss (model.copy_warmup); 0: none
    max_examples: int = Field(0, ge=0)  # 0: the whole train split
    # fp32 logits held at once when scoring the targets (train.logprobs); 0: all of a batch at once
    logits_chunk_mb: float = Field(256.0, ge=0.0)
    # the forward pass: auto = bf16 autocast for fp32 weights on a bf16 GPU or a CPU with bf16
    # instructions (AVX512-BF16 / AMX: ~1.4x faster steps), else the weights' dtype; bf16: always;
    # off: never. SFT trains fp32 weights unless model.dtype names another.
    autocast: Literal["auto", "bf16", "off"] = "auto"
    # each decoder layer keeps only its input for the backward pass and runs again there: a step's
    # activations ~13x smaller (SmolLM2: 1.3 MB a token → 0.1), for ~one more forward pass a step
    gradient_checkpointing: bool = False
    lora: LoRASettings = LoRASettings()
    own_mistakes: OwnMistakesSettings = OwnMistakesSettings()


@dataclass(frozen=True)
class Algorithm:
    """What ``rl.algorithm`` decides, read by the trainer: the level of the importance ratio
    (per token, or GSPO's per sequence), whether advantages are divided by the group's std, and
    the token aggregation that ``rl.loss_aggregation: auto`` means (None: a sequence-level loss
    has none to choose)."""

    ratio: Literal["token", "sequence"]
    scale_std: bool
    aggregation: str | None


# grpo: token ratio, (r - mean)/(std + eps) advantages; dr_grpo: no std scaling, token sums over
# a constant; gspo: sequence ratio. DAPO = grpo + clip_eps_high > clip_eps + token_mean.
# Adding a loss variant that combines these switches: one entry here (rl.algorithm takes its name).
ALGORITHMS = {
    "grpo": Algorithm("token", scale_std=True, aggregation="seq_mean_token_mean"),
    "gspo": Algorithm("sequence", scale_std=True, aggregation=None),
    "dr_grpo": Algorithm("token", scale_std=False, aggregation="seq_mean_token_sum_norm"),
}


# The token aggregations of the loss, the one list: train.losses.token_weights has a branch for
# each (tests/test_registries.py checks it).
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


class RLAsyncSettings(_Section):
    """``rl.async``: asynchronous rollouts with bounded staleness (``train.rollout_producer``). A
    producer process samples the next steps' groups with the newest weights it has while the
    trainer updates; the loss corrects for the older weights with the decoupled objective
    (``train.losses``: the clip against the trainer's own log-probabilities before the update,
    each token weighted by min(π_prox/π_behaviour, ``is_cap``))."""

    # false: the synchronous loop, exactly as without this section
    enabled: bool = False
    # Optimizer steps a trained batch's weights may lag the trainer's. 1 overlaps one rollout with
    # one update (verl's one-step-off-policy); 0 keeps the producer in lockstep (no overlap: a check
    # of the machinery, weights of 1); above 8 the importance weights, not the data, decide.
    max_staleness: int = Field(1, ge=0, le=8)
    # Truncation of the importance weight π_prox/π_behaviour per token (AReaL's behaviour-weight
    # cap, NeMo RL's truncated importance sampling): a token the sampler found far less likely than
    # the trainer now does cannot dominate the batch. At least 1: on-policy tokens keep weight 1.
    is_cap: float = Field(2.0, ge=1.0, le=100.0)
    # Seconds the trainer waits for the producer's next batch (its start, a model load and a vLLM
    # engine's included) before it fails the run as hung; a producer that exits fails it at once.
    timeout_s: float = Field(600.0, gt=0.0)
    # torch threads of the producer process (its sampler's matrix products); the trainer keeps its own
    threads: int = Field(1, ge=1, le=256)
    # GPUs of the producers, one per training process, numbered as the machine (nvidia-smi) numbers
    # them, whatever CUDA_VISIBLE_DEVICES a launcher gives the trainers: rank r's producer samples
    # on devices[r] alone (its vLLM engine takes generation.vllm.gpu_memory_utilization of that
    # GPU), leaving the trainer's GPUs to the update, as verl's and TRL's asynchronous trainers place
    # their rollout servers. Empty: each producer shares its rank's device (a CPU: its own threads).
    devices: list[Annotated[int, Field(ge=0)]] = []


class RLScoresSettings(_Section):
    """``rl.scores``: the train questions scored by RL's starting policy before the run
    (``progress-sql train score``, the DVC stage ``score_questions``; ``train.question_scores``),
    which ``rl.questions: band`` draws from. A question gets ``k`` single-turn samples from the
    rollout sampler (generation.backend at generation.temperature and top_p), each judged for EX
    as the evaluation judges; its pass rate is correct / k."""

    out_dir: str = "outputs/question_scores"  # scores.jsonl (one line a question) and summary.json
    k: int = Field(8, ge=1)  # samples a question
    pool: int = Field(400, ge=0)  # train questions of rl.hardness scored (a seeded sample); 0: all
    # RL draws the questions whose pass rate lies strictly inside the band, low < rate < high: the
    # default keeps those answered right in some samples and wrong in others (ZhSQL-R1's rule), so
    # the rates 0 and 1 are never inside, whatever the band
    low: float = Field(0.0, ge=0.0, le=1.0)
    high: float = Field(1.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _band(self) -> "RLScoresSettings":
        if self.low >= self.high:
            raise Conflict(f"rl.scores.low ({self.low:g}) must be below rl.scores.high ({self.high:g}): the band "
                           "low < rate < high would hold no question", "rl.scores.low", "rl.scores.high")
        return self


class RLDynamicSamplingSettings(_Section):
    """``rl.dynamic_sampling``: DAPO's dynamic sampling (``train.dynamic_sampling``). A group whose
    G episodes are all equally correct (``signal: ex``) or all equally rewarded (``signal:
    reward``) has no signal: it is kept out of the update (no forward or backward pass), and more
    questions are drawn, questions_per_step at a time, until questions_per_step groups have one
    or ``max_rounds`` draws were made."""

    enabled: bool = False
    signal: Literal["ex", "reward"] = "ex"
    # draws of questions_per_step questions a step, the first included; the question stream
    # advances by all of them every step, drawn or not (ranks and producers agree without asking)
    max_rounds: int = Field(3, ge=1, le=32)


# The splits the check during RL may read: any but the train split RL draws from.
CHECK_SPLITS = tuple(s for s in (*CORPUS_SPLITS, *sources.VARIANTS) if s != "train")


class RLCheckSettings(_Section):
    """``rl.check``: a check during RL on questions it never draws (``train.check``): greedy
    single-turn EX, the evaluation's protocol, on the first ``max_questions`` of ``split``. The
    default split, indomain, holds unseen questions on the train databases; dev and test are
    what the project reports, and a policy picked on them would look better there than it is."""

    every: int = Field(0, ge=0)  # steps between checks (the run's last step is checked too); 0: off
    split: Literal[CHECK_SPLITS] = "indomain"  # type: ignore[valid-type]
    max_questions: int = Field(100, ge=1)
    # the policy saved as <out>/final: the last one, or the one of the best check (rl_run.json says which step)
    final: Literal["last", "best"] = "last"

    @model_validator(mode="after")
    def _best_needs_checks(self) -> "RLCheckSettings":
        if self.final == "best" and self.every == 0:
            raise Conflict("rl.check.final best picks the policy of the best check: set rl.check.every above 0 "
                           "(or rl.check.final: last)", "rl.check.final", "rl.check.every")
        return self


class RLSettings(_Section):
    # `async` is a Python keyword: the field is async_, its key in params.yaml and --set `async`
    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)
    # renamed ("pool" is the sandbox's, sql.pool)
    moved_keys = {"rl.question_pool": "rl.questions", "rl.pool_candidates": "rl.solved_candidates"}
    init_from: str = "outputs/sft"  # policy to start from (path or hub id)
    out_dir: str = "outputs/rl"
    recipe: str = "progress"  # a name of the reward registry (progress_sql.rewards.names())
    env: str = "odt_feedback"  # a name of the environment registry (progress_sql.envs.names())
    algorithm: Literal[tuple(ALGORITHMS)] = "grpo"  # type: ignore[valid-type]  # see ALGORITHMS
    # auto: the algorithm's own (ALGORITHMS: grpo → seq_mean_token_mean, dr_grpo → seq_mean_token_sum_norm)
    loss_aggregation: Literal[("auto", *AGGREGATIONS)] = "auto"  # type: ignore[valid-type]
    group_size: int = Field(8, ge=2)  # G rollouts per question
    questions_per_step: int = Field(4, ge=1)
    # Spider hardness levels of the train questions RL draws from. A group teaches correctness only
    # when some of its G rollouts are right; questions far beyond the policy never give one.
    hardness: list[Literal[HARDNESS_LEVELS]] = list(HARDNESS_LEVELS)  # type: ignore[valid-type]
    # all: every train question of rl.hardness. solved: only those the starting policy answers
    # right with one greedy output (the eval protocol), found by a pass over them at the start
    # of the run (counted in rl.max_minutes): a small policy gets a correctness signal in most
    # of these groups and in few of the others (docs/experiments/2026-12-02-rl-on-solved-questions.md).
    # band: only those whose pass rate, scored before the run (rl.scores: `progress-sql train
    # score`), lies inside the band: the groups likely to be right and wrong in part.
    questions: Literal["all", "solved", "band"] = "all"
    solved_candidates: int = Field(400, ge=0)  # solved: train questions the pass tries (a seeded sample); 0: all
    scores: RLScoresSettings = RLScoresSettings()  # rl.questions band: the scores and the band (RLScoresSettings)
    steps: int = Field(6, ge=1)
    max_minutes: float = Field(2.5, gt=0.0)  # wall-clock budget; stops after the running step
    lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)  # AdamW
    micro_batch_size: int = Field(8, ge=1)  # sequences per forward/backward
    # > 0: a micro-batch holds as many sequences (sorted by length) as fit in this many tokens
    # (packed: real tokens; padded: rows × longest), at least one; micro_batch_size is then not
    # used. 0: micro_batch_size sequences.
    micro_batch_tokens: int = Field(0, ge=0)
    # true: a micro-batch's trajectories in one row without padding, attention kept inside each
    # (train.packing); false: right-padded rows (to compare, or for a model whose attention cannot pack)
    packing: bool = True
    # packed: a group's trajectories in one micro-batch run their common prefix (the question's
    # prompt) once, each continuation attending to it (false: every trajectory in full)
    shared_prefix: bool = True
    # shared_prefix: a common prefix shorter than this runs in each trajectory (a segment of its own
    # costs each continuation a longer attention call, more than so few tokens save)
    shared_prefix_min_tokens: int = Field(16, ge=1)
    # shared_prefix: queries per attention call of a continuation (inference.attention). One masked
    # call computes the whole [continuation, prompt + continuation] rectangle; blocks keep the work
    # near the causal triangle. The values are the same for any size (192: the fastest of 64-384 on
    # CPU for 550-1,000-token continuations of 220-280-token prompts); 0: one call a continuation
    attention_query_block: int = Field(192, ge=0)
    # fp32 logits held at once when scoring the sampled tokens (train.logprobs): a real vocabulary
    # (Qwen2.5: 151,936) is 0.6 MB a token, so a whole micro-batch's would dwarf the model; 0: all at once
    logits_chunk_mb: float = Field(256.0, ge=0.0)
    # the update's forward passes (and the old-policy and KL-reference passes, so that every ratio
    # compares one precision): as sft.autocast; fp32 weights and optimiser kept (train.precision)
    autocast: Literal["auto", "bf16", "off"] = "auto"
    lora: RLLoRASettings = RLLoRASettings()  # LoRA RL: adapters trained, KL reference = adapters off
    updates_per_batch: int = Field(1, ge=1)  # optimisation passes over one batch of rollouts
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0)
    clip_eps_high: float = Field(0.2, gt=0.0, lt=1.0)  # DAPO clip-higher: set above clip_eps (0.28)
    kl_beta: float = Field(0.0, ge=0.0)  # 0: no reference model is kept
    adv_eps: float = Field(1e-6, gt=0.0)
    # Negative advantages are multiplied by this (1.0: GRPO as published). Below 1, wrong rollouts
    # are pushed down less than right ones are pushed up: a small policy's many wrong rollouts
    # otherwise drag its few right ones down with them (docs/experiments/2026-12-01-negative-advantage-scale.md).
    negative_advantage_scale: float = Field(1.0, ge=0.0, le=1.0)
    grad_clip: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    deepspeed: Literal["auto", "always", "never"] = "auto"  # auto: DeepSpeed on GPU, plain torch on CPU
    deepspeed_config: str = "configs/deepspeed/zero2.json"
    save_rollouts: bool = True  # every step's episodes (texts, rewards, token ids) to rollouts/step-N.jsonl
    log_episodes: int = Field(4, ge=0, le=64)  # episodes a step shown turn by turn in MLflow (best to worst); 0: none
    seed: int = Field(0, ge=0)
    async_: RLAsyncSettings = Field(RLAsyncSettings(), alias="async")  # asynchronous rollouts (RLAsyncSettings)
    dynamic_sampling: RLDynamicSamplingSettings = RLDynamicSamplingSettings()  # groups without signal left out (DAPO)
    check: RLCheckSettings = RLCheckSettings()  # EX on questions RL never draws, every few steps; the best kept

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, name: str) -> str:
        return _registered("reward recipe", name, rewards.names())

    @field_validator("env")
    @classmethod
    def _known_env(cls, name: str) -> str:
        return _registered("environment", name, envs.names())

    @model_validator(mode="after")
    def _clip_range(self) -> "RLSettings":
        if self.clip_eps_high < self.clip_eps:
            raise Conflict("rl.clip_eps_high must be at least rl.clip_eps", "rl.clip_eps_high", "rl.clip_eps")
        if self.spec.aggregation is None and self.loss_aggregation != "auto":
            raise Conflict(f"rl.loss_aggregation: {self.algorithm} averages sequence ratios; leave it at auto",
                           "rl.loss_aggregation", "rl.algorithm")
        return self

    @model_validator(mode="after")
    def _hardness_levels(self) -> "RLSettings":
        if not self.hardness or len(set(self.hardness)) != len(self.hardness):
            raise ValueError("rl.hardness must name at least one level, each once")
        return self

    @property
    def spec(self) -> Algorithm:
        """What ``algorithm`` decides (``ALGORITHMS``)."""
        return ALGORITHMS[self.algorithm]

    @property
    def aggregation(self) -> str | None:
        """The token aggregation the loss uses (``loss_aggregation`` with ``auto`` resolved)."""
        return self.spec.aggregation if self.loss_aggregation == "auto" else self.loss_aggregation


# ----------------------------------------------------------------------------- evaluation
EVAL_SPLITS = (*CORPUS_SPLITS, *sources.VARIANTS)  # what `eval --split` and eval.splits take
# eval.splits' default, from the registries: in-domain, then every split but train, then every
# variant a source registers (a new one is evaluated without a line here)
DEFAULT_EVAL_SPLITS = (INDOMAIN, *(s for s in CORPUS_SPLITS if s not in ("train", INDOMAIN)), *sources.VARIANTS)
EvalSplit = Literal[EVAL_SPLITS]  # type: ignore[valid-type]


class EvalSettings(_Section):
    """`progress-sql eval` (progress-sql.md §5.1, Appendix E.5): single-turn greedy and Vote@k
    on the corpus splits and robustness variants, optionally the multi-turn tool protocol."""

    splits: list[EvalSplit] = list(DEFAULT_EVAL_SPLITS)
    greedy: bool = True
    vote_k: int = Field(0, ge=0, le=256)  # Vote@k over sampled outputs (paper: 8; cpu-long: 4); 0 = off
    pass_k: int = Field(0, ge=0, le=256)  # pass@k from the same samples; 0 = off
    # Sampling temperature of the Vote@k / pass@k samples. The paper does not state it; 0.8 is
    # the value we recall from OmniSQL's Maj@8 evaluation scripts (not in our reference copy).
    temperature: float = Field(0.8, gt=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_examples: int = Field(40, ge=0)  # per split (CPU default); 0: every example
    multi_turn: bool = False  # also run the SQL-tool protocol (SQL-Trail / SkyRL), greedy
    multi_turn_env: str = "exec_feedback"  # the environment of that protocol; its feedback may not read the gold
    ts: bool = True  # test-suite accuracy where a database has neighbours
    out_dir: str = "reports/eval"
    # The starting points the pipeline's closing table pairs RL against, evaluated once as their
    # own stages (evaluate_zero_shot: model.base_dir, evaluate_sft: sft.out_dir)
    zero_shot_out_dir: str = "reports/eval-zero-shot"
    sft_out_dir: str = "reports/eval-sft"
    batch_size: int = Field(64, ge=1)  # examples per generation + execution round
    gate_metric: str = "dev/greedy/ex"  # flat metric key the model registry promotes on
    log_examples: int = Field(2, ge=0)  # best and worst greedy answers of each split logged as MLflow traces

    @field_validator("multi_turn_env")
    @classmethod
    def _test_time_env(cls, name: str) -> str:
        _registered("environment", name, envs.names())
        if envs.get(name).reads_gold:
            raise ValueError(f"{name!r} reads the gold query in its feedback; it cannot run at test time")
        return name

    @model_validator(mode="after")
    def _something_to_run(self) -> "EvalSettings":
        if not self.splits:
            raise ValueError("eval.splits must name at least one split")
        if len(set(self.splits)) != len(self.splits):
            raise ValueError("eval.splits lists a split twice")
        if not (self.greedy or self.vote_k or self.pass_k or self.multi_turn):
            raise Conflict("eval: greedy, vote_k, pass_k and multi_turn are all off; nothing to evaluate",
                           "eval.greedy", "eval.vote_k", "eval.pass_k", "eval.multi_turn")
        return self


# ----------------------------------------------------------------------------- tracking
class TrackingSettings(_Section):
    """MLflow tracking and the model registry (progress_sql.tracking). The gate metric the
    registry promotes on is ``eval.gate_metric``."""

    enabled: bool = True  # false: stages run without MLflow (nothing is logged or registered)
    # "" = the MLFLOW_TRACKING_URI environment variable when set, else sqlite:///<cwd>/mlruns/mlflow.db
    tracking_uri: str = ""
    experiment: str = "progress-sql"
    model_name: str = "progress-sql-policy"  # registered model name
    champion_alias: str = "champion"
    gate_min_delta: float = Field(0.0, ge=0.0)  # promote only when candidate > champion + this
    model_cache_dir: str = "outputs/registry"  # where models:/ URIs are downloaded to be loaded


# ----------------------------------------------------------------------------- studies
class StudySettings(_Section):
    """``progress-sql study`` and the ``run-study`` flow (progress_sql.studies):
    where a study's runs and report go, and how many arm × seed runs go at once. The
    budget itself (steps, trajectories, seeds, splits) is the study file's."""

    out_dir: str = "outputs/studies"  # OUT/<name>/<scale>/<arm>/seed-<k>/: each arm × seed's RL and evaluation
    shared_dir: str = "outputs/studies/shared"  # corpus, tiny policy and SFT checkpoints, keyed by their settings
    report_dir: str = "reports/studies"  # REPORT/<name>/<scale>/: report.md, report.html, figures, table.json
    max_parallel: int = Field(1, ge=1)  # arm × seed runs at once (> 1: each in its own process)


# ----------------------------------------------------------------------------- root
class Settings(_Section):
    moved_keys = {"compare": "study"}  # the section of `progress-sql study`, once `compare-run`
    seed: int = Field(0, ge=0)
    sandbox: SandboxSettings = SandboxSettings()
    odt: ODTSettings = ODTSettings()
    rewards: RewardSettings = RewardSettings()
    env: EnvSettings = EnvSettings()
    data: DataSettings = DataSettings()
    model: ModelSettings = ModelSettings()
    generation: GenerationSettings = GenerationSettings()
    sft: SFTSettings = SFTSettings()
    rl: RLSettings = RLSettings()
    eval: EvalSettings = EvalSettings()
    tracking: TrackingSettings = TrackingSettings()
    study: StudySettings = StudySettings()

    @model_validator(mode="after")
    def _async_samples_raw(self) -> "Settings":
        # The importance weight's denominator is the sampler's log-probability of each token, which
        # every backend reports for the raw model (temperature 1, no top-p): only then is it the
        # probability the token was drawn with.
        gen = self.generation
        if self.rl.async_.enabled and (gen.temperature != 1.0 or gen.top_p != 1.0):
            raise Conflict("rl.async needs generation.temperature 1.0 and generation.top_p 1.0: the sampler reports "
                           "the raw model's log-probabilities, the importance weight's denominator "
                           f"(got temperature {gen.temperature}, top_p {gen.top_p})",
                           "rl.async.enabled", "generation.temperature", "generation.top_p")
        return self


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    """The built-in defaults (identical to the shipped params.yaml)."""
    return Settings()
