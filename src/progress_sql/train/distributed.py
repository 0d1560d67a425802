"""Training engines: DeepSpeed (ZeRO-2/3 from ``configs/deepspeed``) or plain torch, behind
one small interface so the RL loop has a single code path.

    engine = make_engine(model, settings.rl, use_deepspeed=..., total_updates=..., grad_accum=...)
    out = engine(input_ids=..., attention_mask=...)      # forward (rl.autocast: bf16 where the device has it)
    engine.backward(loss, last=...)                       # loss already scaled to its batch share;
    stepped = engine.step()                               # optimizer + schedule after the batch's last
    engine.save(path) / engine.load(path)                 # model, optimizer, scheduler
    with engine.gathered(): ...                           # full weights (ZeRO-3) for generation
    engine.broadcast_flag(flag)                           # rank 0's decision, a tensor on engine.device
    engine.close()                                        # the process group it opened is destroyed

The caller says which micro-batch is a batch's last (``last``): micro-batches are cut by tokens
(``rl.micro_batch_tokens``), so their number changes from step to step.

DeepSpeed on CPU (CI): ``DS_ACCELERATOR=cpu``, one process with RANK/WORLD_SIZE/MASTER_* set
for the run (``process_environment``), gloo. A single CPU process has no peer to share memory
with, so DeepSpeed's shared-memory all-reduce op (a C++ build of ~35 s on first use) is switched
off there; with several processes it is built once into ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/progress_sql/torch_extensions``). Multi-GPU runs come from the ``deepspeed``
launcher, which sets the same variables (docs/multi_gpu.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from progress_sql.params import PACKAGE_CONFIGS, RLSettings
from progress_sql.train.lora import save_policy
from progress_sql.train.memory import release_free_heap
from progress_sql.train.precision import autocast, autocast_dtype

EXTENSIONS_CACHE = Path("~/.cache/progress_sql/torch_extensions").expanduser()


def use_deepspeed(mode: str) -> bool:
    """``always``/``never``; ``auto``: DeepSpeed when a GPU is present, plain torch on CPU."""
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"rl.deepspeed must be auto, always or never, got {mode!r}")
    return mode == "always" or (mode == "auto" and torch.cuda.is_available())


def free_port() -> int:
    """A TCP port free on this host right now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def process_environment(deepspeed: bool) -> Iterator[None]:
    """For the length of a run: the process-group variables of a single process (a launcher sets
    them for many) and, on CPU, DeepSpeed's CPU accelerator. Existing values are kept; those it set
    are removed at the end, because torch keeps a closed group's store listening on MASTER_PORT:
    a port left behind fails a later run in this process, or a child's, with EADDRINUSE."""
    if not deepspeed:
        yield
        return
    wanted = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(free_port()), "TORCH_EXTENSIONS_DIR": str(EXTENSIONS_CACHE)}
    if not torch.cuda.is_available():
        wanted["DS_ACCELERATOR"] = "cpu"
    added = [key for key in wanted if key not in os.environ]
    os.environ.update({key: wanted[key] for key in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def resolve_config_path(path: str | os.PathLike) -> Path:
    """``rl.deepspeed_config`` as given (relative to the working directory), or a
    ``configs/...`` path of the package's own (``configs/deepspeed/zero2.json``)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    shipped = PACKAGE_CONFIGS.parent / p
    if not p.is_absolute() and shipped.is_file():
        return shipped
    raise FileNotFoundError(f"DeepSpeed config {path} not found (rl.deepspeed_config)")


def deepspeed_config(rl: RLSettings, *, grad_accum: int, world: int, bf16: bool) -> dict[str, Any]:
    """The JSON config of ``rl.deepspeed_config`` with the run's batch sizes, clipping and bf16."""
    path = resolve_config_path(rl.deepspeed_config)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    config["train_micro_batch_size_per_gpu"] = rl.micro_batch_size
    config["gradient_accumulation_steps"] = grad_accum
    config["train_batch_size"] = rl.micro_batch_size * grad_accum * world
    config["gradient_clipping"] = rl.grad_clip
    config["bf16"] = {**config.get("bf16", {}), "enabled": bf16}
    config.pop("fp16", None)
    if "auto" in json.dumps(config):
        raise ValueError(f"{path}: 'auto' values are Accelerate/TRL conventions; give concrete values")
    return config


def lr_lambda(rl: RLSettings, total_updates: int) -> Callable[[int], float]:
    """LR multiplier per optimizer update: linear warmup over ``rl.warmup_steps`` updates, then
    ``rl.schedule`` (constant, or linear / cosine decay to 0 at ``total_updates``)."""
    warmup, total = rl.warmup_steps, max(1, total_updates)

    def factor(update: int) -> float:
        if warmup and update < warmup:
            return (update + 1) / (warmup + 1)
        if rl.schedule == "constant":
            return 1.0
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return 1.0 - progress if rl.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


# ----------------------------------------------------------------------------- engines
class TorchEngine:
    """Plain torch: AdamW, gradient accumulation until the batch's last micro-batch, clipping;
    before each optimizer step the heap's free pages go back to the system (``train.memory``)."""

    kind = "torch"
    zero_stage = 0

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, grad_clip: float,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.module, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_clip, self.autocast_dtype = grad_clip, autocast_dtype
        self.micro_steps = 0
        self.grad_norm = 0.0
        self._last = False

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def __call__(self, **inputs: Any) -> Any:
        with self.autocast():
            return self.module(**inputs)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision of the training forward (``rl.autocast``), for what runs beside the
        model's own forward (the output head, a chunk at a time: ``train.logprobs``; the KL
        reference's pass)."""
        return autocast(self.device, self.autocast_dtype)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        loss.backward()
        self._last = last

    def step(self) -> bool:
        """Count a micro-batch; after the batch's last one clip, step and schedule."""
        self.micro_steps += 1
        if not self._last:
            return False
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip))
        release_free_heap()  # the freed activations' heap, before the step adds its own
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "micro_steps": self.micro_steps},
                   path / "engine.pt")

    def load(self, path: Path) -> None:
        state = torch.load(path / "engine.pt", map_location="cpu", weights_only=False)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.micro_steps = int(state["micro_steps"])

    def gathered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def save_pretrained(self, out_dir: Path, tokenizer: Any) -> None:
        """The policy as a plain model folder (LoRA: merged, adapters beside it). The run's last act."""
        save_policy(self.module, tokenizer, out_dir)

    def broadcast_flag(self, flag: bool) -> bool:
        return _broadcast_flag(flag, self.device)

    def close(self) -> None:
        """Nothing to release: a plain engine opens no process group."""


class DeepSpeedEngine:
    """A ``deepspeed.initialize`` engine behind the TorchEngine interface."""

    kind = "deepspeed"

    def __init__(self, engine: Any, owns_group: bool, autocast_dtype: torch.dtype | None = None) -> None:
        self.engine = engine
        # torch autocast where DeepSpeed's own bf16 mode is off (CPU): rl.autocast's precision
        self.autocast_dtype = autocast_dtype
        self.module = engine.module
        self.zero_stage = int(engine.zero_optimization_stage())
        self.grad_norm = 0.0
        self.owns_group = owns_group  # this engine initialised the process group: close() ends it

    @property
    def device(self) -> torch.device:
        return torch.device(self.engine.device)

    def __call__(self, **inputs: Any) -> Any:
        with self.autocast():
            return self.engine(**inputs)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Nothing where DeepSpeed holds the module in its training precision (bf16 on a GPU);
        on CPU the autocast of ``rl.autocast``."""
        return autocast(self.device, self.autocast_dtype)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # The boundary is set before backward: ZeRO reduces gradients in its backward hooks there.
        self.engine.set_gradient_accumulation_boundary(last)
        # The loss is already this micro-batch's share of the batch loss: no 1/GAS scaling.
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> bool:
        boundary = bool(self.engine.is_gradient_accumulation_boundary())
        self.engine.step()
        if boundary:
            norm = self.engine.get_global_grad_norm()
            self.grad_norm = float(norm) if norm is not None else 0.0
        return boundary

    @property
    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, path: Path) -> None:
        self.engine.save_checkpoint(str(path.parent), tag=path.name, save_latest=False)

    def load(self, path: Path) -> None:
        loaded, _ = self.engine.load_checkpoint(str(path.parent), tag=path.name)
        if loaded is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint in {path}")

    def gathered(self) -> contextlib.AbstractContextManager:
        """Under ZeRO-3, the full parameters for the duration (generation, saving)."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        return self._zero3_gathered()

    @contextlib.contextmanager
    def _zero3_gathered(self) -> Iterator[None]:
        import deepspeed  # noqa: PLC0415

        offload = getattr(self.engine.optimizer, "parameter_offload", None)
        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            if offload is None:
                yield
                return
            # ZeRO-3's module hooks fetch and release each module's partition around every
            # forward: with all of it gathered they only cost time, once per module and decoded
            # token. Off while gathered, registered again after (which restarts their trace).
            for param in self.module.parameters():
                param.ds_active_sub_modules.clear()
            for hook in offload.forward_hooks + offload.backward_hooks:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)

    def save_pretrained(self, out_dir: Path, tokenizer: Any) -> None:
        with self.gathered():  # ZeRO-3: the full weights are in place while this runs
            if rank() == 0:
                save_policy(self.module, tokenizer, out_dir)

    def broadcast_flag(self, flag: bool) -> bool:
        return _broadcast_flag(flag, self.device)

    def close(self) -> None:
        """Release the engine (ZeRO-3's hooks on the module) and, when it opened the process
        group, destroy that too: a later run in the same process starts from a clean slate."""
        with contextlib.suppress(Exception):
            self.engine.destroy()
        _restore_linear()
        if self.owns_group and torch.distributed.is_available() and torch.distributed.is_initialized():
            import deepspeed.comm as dist  # noqa: PLC0415

            dist.destroy_process_group()
            self.owns_group = False


Engine = TorchEngine | DeepSpeedEngine


def _restore_linear() -> None:
    """ZeRO-3 replaces ``torch.nn.functional.linear`` process-wide with its own autograd function
    ("this will persist unless manually reset"); its results differ in the last bits, so a later
    run in the same process (a test, a comparison's next arm) would not reproduce. Put it back."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as patcher  # noqa: PLC0415

    original = getattr(patcher, "linear_bk", None)
    if original is not None:
        torch.nn.functional.linear = original


def _broadcast_flag(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every rank; the tensor lives on ``device``, the engine's (NCCL takes
    CUDA tensors only, gloo CPU ones). Without a process group, ``flag`` itself."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    t = torch.tensor([int(flag)], device=device)
    torch.distributed.broadcast(t, src=0)
    return bool(t.item())


@contextlib.contextmanager
def _no_shm_comm_op() -> Iterator[None]:
    # One CPU process has no peer for DeepSpeed's shared-memory all-reduce; building that op
    # costs ~35 s of C++ compilation on first use, so it is not offered to the comm backend.
    import deepspeed  # noqa: PLC0415

    ops = getattr(deepspeed.ops, "__compatible_ops__", None)
    name = "deepspeed_shm_comm"
    if not isinstance(ops, dict) or name not in ops or world_size() > 1 or torch.cuda.is_available():
        yield
        return
    before = ops[name]
    ops[name] = False
    try:
        yield
    finally:
        ops[name] = before


def make_engine(
    model: torch.nn.Module, rl: RLSettings, *, deepspeed: bool, total_updates: int, grad_accum: int
) -> Engine:
    """AdamW (lr, weight decay of ``rl``) with the ``lr_lambda`` schedule, in a DeepSpeed engine
    (config from ``rl.deepspeed_config``) or a plain TorchEngine, at the precision of
    ``rl.autocast`` (``train.precision``): a plain engine and DeepSpeed on CPU autocast their
    forward; DeepSpeed on a GPU runs its own bf16 mode (its module in bf16, fp32 master weights).
    DeepSpeed needs the variables of ``process_environment``, entered by the caller for the run."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=rl.lr, weight_decay=rl.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(rl, total_updates))
    on_gpu = torch.cuda.is_available()
    dtype = autocast_dtype(rl.autocast, next(model.parameters()).device)
    if not deepspeed:
        return TorchEngine(model, optimizer, scheduler, rl.grad_clip, autocast_dtype=dtype)
    bf16 = on_gpu and dtype == torch.bfloat16
    import deepspeed as ds  # noqa: PLC0415 - heavy import, only for DeepSpeed runs

    config = deepspeed_config(rl, grad_accum=grad_accum, world=world_size(), bf16=bf16)
    owns_group = not torch.distributed.is_initialized()
    with _no_shm_comm_op():
        if owns_group:
            ds.init_distributed(dist_backend=None if on_gpu else "gloo")
        try:
            engine, _, _, _ = ds.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
        except BaseException:
            if owns_group and torch.distributed.is_initialized():
                import deepspeed.comm as dist  # noqa: PLC0415

                dist.destroy_process_group()
            raise
    return DeepSpeedEngine(engine, owns_group, autocast_dtype=None if on_gpu else dtype)
