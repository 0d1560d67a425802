"""train.precision: the autocast of SFT (sft.autocast) and RL (rl.autocast), and the bound on the
kernels a CPU's bf16 products compile, one per shape."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from progress_sql.inference.models import has_bf16  # noqa: E402
from progress_sql.train.precision import autocast_dtype, training_autocast  # noqa: E402

CPU = torch.device("cpu")


def test_modes_resolve_to_bf16_only_for_fp32_weights_on_a_device_that_has_it():
    assert autocast_dtype("bf16", CPU) == torch.bfloat16
    assert autocast_dtype("off", CPU) is None
    assert autocast_dtype("auto", CPU) == (torch.bfloat16 if has_bf16(CPU) else None)
    assert autocast_dtype("auto", CPU, torch.bfloat16) is None  # low-precision weights as they are
    with training_autocast("bf16", CPU, torch.float32):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        # with SFT's layers checkpointed the cache alone would hold a bf16 copy of every weight
        assert not torch.is_autocast_cache_enabled()
    with pytest.raises(ValueError, match="auto, bf16 or off"):
        autocast_dtype("fp8", CPU)


# 300 bf16 products of as many shapes (a training step's token count changes with every batch),
# forward and backward; the resident growth in MB.
_SHAPES = """
import gc, sys, torch
def rss():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024
torch.set_num_threads(1)
if sys.argv[1] == "bf16":
    from progress_sql.train.precision import autocast_dtype
    autocast_dtype("bf16", torch.device("cpu"))  # what SFT and the RL engine do before their first step
w = torch.randn(256, 128, requires_grad=True)
def step(n):
    x = torch.randn(n, 128, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w)
    y.float().sum().backward()
for n in range(16, 48):
    step(n)
gc.collect()
before = rss()
for n in range(48, 348):
    step(n)
gc.collect()
print(rss() - before)
"""


@pytest.mark.skipif(not has_bf16(CPU), reason="no bf16 instructions: products in bf16 compile no kernels here")
def test_choosing_bf16_bounds_the_kernels_compiled_per_shape():
    """oneDNN compiles a kernel for each shape of a bf16 product and kept 1,024 of them: SmolLM2's
    SFT grew ~25 MB a step (another shape each batch) to GBs. Choosing bf16 bounds the caches
    (train.precision.KERNEL_CACHE), in a fresh process as a run's: 300 shapes grew it 634 MB
    before, 22 MB after."""
    growth = {}
    for arm in ("plain", "bf16"):
        out = subprocess.run([sys.executable, "-c", _SHAPES, arm], capture_output=True, text=True, timeout=300,
                             env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
        assert out.returncode == 0, out.stderr[-2000:]
        growth[arm] = float(out.stdout.split()[-1])
    assert growth["bf16"] < 100 < 300 < growth["plain"], growth

