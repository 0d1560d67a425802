"""Asynchronous rollouts with bounded staleness (``rl.async``): a producer process samples the
next steps' rollouts while the trainer updates.

The producer is a process of its own (torch.multiprocessing, spawn: it shares no state with the
trainer but what is handed to it), running ``rl.async.threads`` torch threads. It holds its own
sampler: the policy loaded from ``rl.init_from`` behind the ``generation.backend`` backend (the
transformers one, or a vLLM engine of its own), the recipe and the environments. It draws the
question stream the trainer would (``train.questions.question_indices`` from the data position
it was started at), samples whole groups (the G episodes of every question of a step together,
through ``train.dynamic_sampling.sampled_step`` with the step's seed, as the synchronous loop
does: with rl.dynamic_sampling, more draws until enough groups have a signal), scores and
tokenises them, and puts one step's batch at a time into a bounded queue, tagged with the step
and the *version* of the weights it sampled with (the optimizer steps they had taken).

Weights travel through shared memory (``train.weight_board``): the trainer publishes its new
parameters after each update; before each batch the producer loads the newest version into its
sampler through the backend's own ``sync_weights`` (from a module whose parameters are the
shared tensors), under the board's lock. A LoRA policy's adapters are merged into the shared
weights (``inference.lora.merged_weights``).

Staleness: the batch of step s is trained by weights of version s − 1, so its staleness is
s − 1 − v. The producer does not start step s before version s − 1 − ``max_staleness`` is on
the board, and the queue holds at most ``max(max_staleness, 1)`` batches: the staleness never
exceeds ``max_staleness``. ``RolloutProducer.next_batch`` checks it and that every step comes
once, in order.

Placement (``CUDA_VISIBLE_DEVICES`` of its process): the producer samples on its rank's trainer's
device (a CPU: ``rl.async.threads`` threads of its own), or with ``rl.async.devices`` on a GPU of
its own per rank, where its vLLM engine need not share memory with the update.

Failure: an exception in the producer is sent back with its traceback and raised by
``next_batch`` as ``ProducerFailed``; a producer that exits (killed, out of memory) fails it
within a second, one that sends nothing for ``rl.async.timeout_s`` fails it as hung. ``close``
stops the producer however the run ends (its vLLM engine closed by the producer on SIGTERM).
Batches sampled but not trained when the run ends are dropped: a run resumed from a checkpoint
starts a new producer at the checkpoint's data position, with the checkpoint's weights.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from progress_sql.corpus.records import Example
from progress_sql.inference.lora import merged_weights
from progress_sql.params import Settings
from progress_sql.train.step_batch import StepBatch
from progress_sql.train.weight_board import POLL_S, WeightBoard

PROCESS_NAME = "rollout-producer"


class ProducerFailed(RuntimeError):
    """The rollout producer raised (its traceback in the message), exited, or hung."""


@dataclass
class ProducerSpec:
    """What the producer process needs (pickled to it): the run's settings and corpus, the train
    questions (``rl_questions``), the first step it samples and the data position before it,
    and this process's rank among ``world`` (each rank has its producer and its slice)."""

    settings: Settings
    corpus_dir: str
    train: list[Example]
    first_step: int
    data_position: int
    rank: int = 0
    world: int = 1


@dataclass
class ProducedBatch:
    """One step's rollouts from the producer: its ``StepBatch`` less the tensor (advantages as a
    list), the weights' ``version``, the data position after its questions, the seconds the
    producer spent loading weights (``sync_s``) and waiting for them (``wait_s``), and the groups
    to train (``StepBatch.train_groups``)."""

    step: int
    version: int
    data_position: int
    episodes: list[Any]
    scored: list[Any]
    trajs: list[Any]
    advantages: list[float]
    rollout_s: float
    generate_s: float
    sync_s: float
    wait_s: float
    train_groups: list[int] | None = None

    def step_batch(self) -> StepBatch:
        return StepBatch(self.episodes, self.scored, self.trajs, torch.tensor(self.advantages, dtype=torch.float32),
                         self.rollout_s, self.generate_s, self.train_groups)


@dataclass
class _Failure:
    message: str  # the producer's traceback


class RolloutProducer:
    """The trainer's side: starts the producer process, publishes weights, takes batches."""

    def __init__(self, spec: ProducerSpec, weights: dict[str, torch.Tensor], version: int,
                 trainer_device: torch.device | None = None) -> None:
        a = spec.settings.rl.async_
        self.max_staleness, self.timeout_s = a.max_staleness, a.timeout_s
        self.next_step = spec.first_step
        trainer_gpu = None
        if trainer_device is not None and trainer_device.type == "cuda":
            trainer_gpu = trainer_device.index if trainer_device.index is not None else torch.cuda.current_device()
        devices = producer_devices(a.devices, spec.rank, spec.world, torch.cuda.device_count(),
                                   os.environ.get("CUDA_VISIBLE_DEVICES"), trainer_gpu)
        ctx = mp.get_context("spawn")
        self.board = WeightBoard(weights, ctx)
        self.board.publish(weights, version)
        self.queue = ctx.Queue(maxsize=max(a.max_staleness, 1))
        # a flag, not an Event: an Event's set() waits for every process asleep in its wait(), and
        # a producer killed there never wakes
        self.stop = ctx.Value("b", 0, lock=False)
        # not a daemon: a vLLM engine starts processes of its own, which a daemon may not;
        # close() ends it however the run ends
        self.process = ctx.Process(target=_produce, name=PROCESS_NAME, daemon=False,
                                   args=(spec, self.board, self.queue, self.stop, devices))
        self.process.start()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def publish(self, module: torch.nn.Module, version: int) -> float:
        """Put ``module``'s weights on the board as ``version``; the seconds it took (waiting for
        a producer that is loading the previous ones included)."""
        started = time.monotonic()
        self.board.publish(merged_weights(module), version, alive=lambda deadline: self._check(deadline, "weights"),
                           timeout_s=self.timeout_s)
        return time.monotonic() - started

    def _check(self, deadline: float, what: str) -> None:
        """Raise ``ProducerFailed`` when the producer has exited or ``deadline`` has passed."""
        if not self.process.is_alive():
            raise ProducerFailed(f"the rollout producer (pid {self.pid}) exited with code "
                                 f"{_exit_text(self.process.exitcode)} ({what})")
        if time.monotonic() > deadline:
            raise ProducerFailed(f"the rollout producer (pid {self.pid}) did not answer in {self.timeout_s:g} s "
                                 f"(rl.async.timeout_s; {what}): it hangs or is too slow")

    def next_batch(self, step: int, trained_version: int) -> ProducedBatch:
        """The batch of ``step``, to be trained by weights of version ``trained_version``:
        raises ``ProducerFailed`` with the producer's error, when it exited, or after
        ``rl.async.timeout_s`` without a batch."""
        if step != self.next_step:
            raise RuntimeError(f"rollout producer: step {step} asked, step {self.next_step} is next "
                               "(a batch is trained once, in order)")
        deadline = time.monotonic() + self.timeout_s
        # The read runs in a thread of its own: a producer killed half-way through sending a batch
        # leaves a part of it in the pipe, and the read would wait for the rest for ever.
        got: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: got.put(self.queue.get()), name="rollout-batch-reader", daemon=True).start()
        while True:
            try:
                item = got.get(timeout=POLL_S)
                break
            except queue.Empty:
                self._check(deadline, f"no batch for step {step}")
        if isinstance(item, _Failure):
            raise ProducerFailed(f"the rollout producer failed:\n{item.message}")
        if item.step != step:
            raise RuntimeError(f"rollout producer: got the batch of step {item.step} for step {step}")
        staleness = trained_version - item.version
        if not 0 <= staleness <= self.max_staleness:
            raise RuntimeError(f"rollout producer: the batch of step {step} was sampled with weights of version "
                               f"{item.version}, {staleness} steps behind {trained_version} "
                               f"(rl.async.max_staleness {self.max_staleness})")
        self.next_step += 1
        return item

    def close(self) -> None:
        """Stop the producer (asked, then SIGTERM, then SIGKILL) and release the queue; safe to
        call twice."""
        self.stop.value = 1
        process = self.process
        if process.pid is not None:
            process.join(timeout=2.0)
            if process.is_alive():
                process.terminate()  # the producer closes its engine on SIGTERM
                process.join(timeout=15.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        self.queue.cancel_join_thread()
        self.queue.close()


def producer_devices(devices: list[int], rank: int, world: int, cuda_count: int, visible: str | None,
                     trainer_gpu: int | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for rank ``rank``'s producer: its GPU of ``rl.async.devices`` (the
    machine's numbering, nvidia-smi's: a launcher's ``CUDA_VISIBLE_DEVICES`` hides the
    producers' GPUs from the trainer), else the trainer's own GPU (``trainer_gpu``, an index
    among the ``cuda_count`` it sees through ``visible``: each rank's producer beside its own
    trainer, not all on the first GPU), else None (a CPU)."""
    if not devices:
        if trainer_gpu is None:
            return None
        return (visible.split(",") if visible else [str(i) for i in range(cuda_count)])[trainer_gpu].strip()
    if cuda_count == 0:
        raise ValueError(f"rl.async.devices {devices} names GPUs, and this machine shows none to the trainer: "
                         "leave it empty ([]) to sample beside the trainer")
    if len(devices) < world:
        raise ValueError(f"rl.async.devices {devices} names {len(devices)} GPU(s) for {world} training processes: "
                         "one per process")
    if not visible and devices[rank] >= cuda_count:
        raise ValueError(f"rl.async.devices: GPU {devices[rank]} of rank {rank} is not among this machine's "
                         f"{cuda_count} (numbered from 0)")
    return str(devices[rank])


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"{code} (killed by {signal.Signals(-code).name})"
    return str(code)


# ----------------------------------------------------------------------------- the producer
def _on_sigterm(_signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signal.SIGTERM)  # the finally clauses close the backend


def _produce(spec: ProducerSpec, board: WeightBoard, out: Any, stop: Any, devices: str | None) -> None:
    """The producer process: sample ``spec``'s steps into ``out`` until the last step or ``stop``
    (on the GPUs ``devices``, when given); an exception goes to ``out`` with its traceback."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    if devices is not None:  # before anything here touches CUDA (a vLLM engine's workers inherit it)
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        with contextlib.ExitStack() as resources:
            _produce_steps(spec, board, out, stop, resources)
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the trainer
        if isinstance(err, SystemExit) and stop.value:
            return
        message = "".join(traceback.format_exception(err))
        with contextlib.suppress(Exception):
            out.put(_Failure(message), timeout=5.0)
        sys.exit(1)


def _put(out: Any, item: Any, stop: Any) -> bool:
    """Put ``item`` (waiting while the queue is full); False when stopped first."""
    while not stop.value:
        try:
            out.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _sampler(settings: Any, board: WeightBoard, resources: contextlib.ExitStack) -> tuple[torch.nn.Module, Any]:
    """(view, chat): a module over the trainer's shared weights (read in place, under the board's
    lock), and the producer's sampler, whose backend loads them on each ``sync_weights``."""
    from progress_sql.inference.backends import (  # noqa: PLC0415 - the producer's own imports
        backend_class,
        make_backend,
        resolved_generation,
    )
    from progress_sql.inference.models import load_policy  # noqa: PLC0415
    from progress_sql.inference.policy import ChatModel  # noqa: PLC0415
    from progress_sql.train.rl_run import disable_dropout  # noqa: PLC0415

    rl, gen = settings.rl, settings.generation
    if rl.async_.devices and not torch.cuda.is_available():  # the GPU rl.async.devices gave this process
        raise ValueError(f"rl.async.devices: GPU {os.environ.get('CUDA_VISIBLE_DEVICES')} is not on this machine "
                         "(nvidia-smi numbers its GPUs from 0)")
    view, tokenizer = load_policy(rl.init_from, dtype="float32", device="cpu")
    params = dict(view.named_parameters())
    if set(params) != set(board.tensors):
        raise RuntimeError(f"the trainer's weights and {rl.init_from}'s differ in their parameters: "
                           f"{sorted(set(params) ^ set(board.tensors))[:5]} (a LoRA head untied from a tied "
                           "embedding cannot be sent to the producer: leave lm_head out of rl.lora.targets)")
    for name, param in params.items():
        param.data = board.tensors[name]
    gen = resolved_generation(gen, view, rl.init_from)  # auto: as the trainer resolved it, for the same model
    model = view  # an engine-style backend loads rl.init_from itself; the module only gives the eos ids
    if not backend_class(gen.backend).own_weights:  # the sampler: a copy of its own (the board changes under it)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, _ = load_policy(rl.init_from, dtype="float32", device=device)
        disable_dropout(model)
        model.eval()
    backend = make_backend(gen, model, tokenizer, rl.init_from, seed=settings.seed)
    resources.callback(backend.close)
    return view, ChatModel(rl.init_from, backend, tokenizer, gen)


def _produce_steps(spec: ProducerSpec, board: WeightBoard, out: Any, stop: Any,
                   resources: contextlib.ExitStack) -> None:
    from progress_sql import rewards  # noqa: PLC0415 - the producer's own imports
    from progress_sql.corpus.records import CorpusLayout  # noqa: PLC0415
    from progress_sql.envs.db_details import SchemaTexts  # noqa: PLC0415
    from progress_sql.train.dynamic_sampling import sampled_step  # noqa: PLC0415
    from progress_sql.train.questions import step_stride  # noqa: PLC0415
    from progress_sql.train.rl_run import env_factory_for  # noqa: PLC0415
    from progress_sql.train.step_batch import sample_step, step_seed  # noqa: PLC0415
    from progress_sql.train.trajectories import max_sequence_tokens  # noqa: PLC0415

    settings = spec.settings
    rl = settings.rl
    torch.set_num_threads(rl.async_.threads)
    layout = CorpusLayout(Path(spec.corpus_dir))
    view, chat = _sampler(settings, board, resources)
    backend = chat.backend
    recipe = rewards.get(rl.recipe)
    judge = rewards.make_judge(recipe.settings_of(settings).weights) if recipe.uses_judge else None
    env_factory = env_factory_for(settings, recipe, SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    max_tokens = max_sequence_tokens(settings.generation, env_factory().max_turns)
    position, version = spec.data_position, -1
    for step in range(spec.first_step, rl.steps + 1):
        # weights at most max_staleness steps behind those that will train this batch (step − 1)
        needed = step - 1 - rl.async_.max_staleness
        waited = time.monotonic()
        while board.version.value < needed:
            time.sleep(0.01)
            if stop.value:
                return
        wait_s, synced = time.monotonic() - waited, time.monotonic()
        if board.version.value > version:
            with board.lock:
                version = int(board.version.value)
                backend.sync_weights(view)
        sync_s = time.monotonic() - synced
        if stop.value:
            return
        def sample(questions: list, draw: int, first_group: int, step: int = step) -> StepBatch:
            return sample_step(settings, chat, recipe, judge, env_factory, layout.database, questions,
                               seed=step_seed(rl.seed, step, spec.rank, draw), max_tokens=max_tokens,
                               first_group=first_group)

        batch = sampled_step(settings, spec.train, position, sample, spec.rank, spec.world)
        position += step_stride(rl, spec.world)
        for ep in batch.episodes:
            ep.tokens = None  # its trajectory holds them: not sent twice
        produced = ProducedBatch(step, version, position, batch.episodes, batch.scored, batch.trajs,
                                 batch.advantages.tolist(), batch.rollout_s, batch.generate_s, sync_s, wait_s,
                                 batch.train_groups)
        if not _put(out, produced, stop):
            return
