"""The plain PyTorch loop that the pipeline's step is measured against, and the short step profile both get.

    python benchmarks/plain_loop.py SHAPE_JSON --vocab 50265 --json out.json [--device cuda] [--compile]
        [--precision fp32|bf16]

SHAPE_JSON is `[model keys, seq_len, micro batch]`. The loop is what a careful user writes by hand: transformers' own
masked-LM class, torch's fused AdamW, clipping to 1.0, bf16 autocast (by default on CUDA), `train.compile`'s per-block
compile, random micro batches replayed on the device; no DeepSpeed, loader or logging (docs/gpu-nodes.md).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import toy_tokenizer  # (and the repository on the path: `pipeline` imports below)

PROFILED_STEPS = 3
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
READS = ("aten::_local_scalar_dense", "aten::nonzero")
"""The operators that wait for a value of the device: item(), bool() and is_nonzero() read through the first."""


def profiler(device: str):
    """A torch profiler of the host's operators, and of the GPU's kernels on CUDA (start it, then stop it)."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device == "cuda" else [])])


def step_profile(step: Callable[[], Any], steps: int, device: str) -> dict[str, Any]:
    """`steps` calls of `step` under the profiler, summarised (`summary`)."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    with profiler(device) as prof:
        for _ in range(steps):
            step()
        sync()
    return summary(prof, steps, device)


def summary(prof, steps: int, device: str) -> dict[str, Any]:
    """A stopped profiler's window: the GPU's idle share (the union of its kernels against the window's span), operator
    calls and device reads per step (READS, synchronize calls, device-to-host copies), the top kernels (CPU operators
    on a CPU run), and the most GPU memory the process has held (what sizes a micro batch to a card)."""
    from torch.autograd import DeviceType

    cuda = device == "cuda"
    events = prof.events()
    on_device = [e for e in events if e.device_type == DeviceType.CUDA] if cuda else []
    span = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) if events else 0
    busy, reach = 0.0, float("-inf")
    for start, end in sorted((e.time_range.start, e.time_range.end) for e in on_device):
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    operators = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in on_device or operators:
        totals[e.name][0] += e.time_range.end - e.time_range.start
        totals[e.name][1] += 1
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:6]
    whole = sum(t for t, _ in totals.values()) or 1.0
    import torch

    return {"steps": steps, "window_ms": round(span / 1e3, 2),
            "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "gpu_idle_share": round(1 - busy / span, 3) if cuda and span else None,
            "operator_calls_per_step": len(operators) / steps,
            "device_reads_per_step": sum(e.name in READS for e in operators) / steps,
            "device_reads_by_range": {name: n / steps for name, n in Counter(
                caller(e) for e in operators if e.name in READS).most_common()},
            "syncs_per_step": sum(e.name in SYNC_CALLS for e in events) / steps,
            "device_to_host_copies_per_step": sum(e.name.startswith("Memcpy DtoH") for e in on_device) / steps,
            "top": [{"name": name[:90], "ms_per_step": round(t / 1e3 / steps, 3), "share": round(t / whole, 3),
                     "calls_per_step": n / steps} for name, (t, n) in top]}


def caller(event) -> str:
    """The nearest range around an operator that is not an operator itself (an optimizer's step, a backward node)."""
    while event.name.startswith("aten::") and event.cpu_parent is not None:
        event = event.cpu_parent
    return "(outside any range)" if event.name.startswith("aten::") else event.name


def random_batches(vocab: int, rows: int, seq_len: int, count: int, device: str) -> list[dict[str, Any]]:
    """`count` micro batches of uniform token ids, 15% of positions labelled (the rest -100)."""
    import torch

    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(count):
        ids = torch.randint(5, vocab, (rows, seq_len), generator=g)
        labels = torch.where(torch.rand(rows, seq_len, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        batches.append({k: v.to(device) for k, v in
                        {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}.items()})
    return batches


def plain_loop(keys: dict[str, Any], seq_len: int, rows: int, vocab: int, device: str, compiled: bool, steps: int,
               warmup: int, profiled: int = PROFILED_STEPS, precision: str | None = None) -> dict[str, Any]:
    """Train the model of `keys` for `warmup` + `steps` steps; tokens/s over the timed steps, then a profile."""
    import torch
    from transformers import AutoModelForMaskedLM

    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import hf_config
    from pipeline.pretrain.step.compile_blocks import compile_blocks

    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(hf_config(ModelConfig(**keys), toy_tokenizer(vocab), seq_len))
    model = model.to(device).train()
    if compiled:
        compile_blocks(model)
    cuda = device == "cuda"
    bf16 = (precision or ("bf16" if cuda else "fp32")) == "bf16"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batches = random_batches(vocab, rows, seq_len, 4, device)
    turn = iter(range(10**9))

    def step() -> None:
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batches[next(turn) % len(batches)]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    started = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warm_s, began = time.perf_counter() - started, time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = time.perf_counter() - began
    rate = steps * rows * seq_len / seconds
    return {"tokens_per_s": rate, "real_tokens_per_s": rate,
            "step_ms": 1e3 * seconds / steps, "warmup_s": round(warm_s, 1), "seq_len": seq_len, "micro_batch": rows,
            "steps_counted": steps, "attention": model.config._attn_implementation,
            "profile": step_profile(step, profiled, device) if profiled else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shape", help="[model keys, seq_len, micro batch] as JSON")
    p.add_argument("--vocab", type=int, required=True, help="the vocabulary size (the check's tokenizer's)")
    p.add_argument("--json", required=True, help="where the row is written")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    keys, seq_len, rows = json.loads(a.shape)
    row = plain_loop(keys, seq_len, rows, a.vocab, a.device, a.compile, a.steps, a.warmup, precision=a.precision)
    Path(a.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
