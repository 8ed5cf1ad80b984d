"""The step's options in one process, timed in CPU time on one thread: eager or compiled model, loop or fused AdamW.

    python benchmarks/step_cpu_time.py [--rounds 3]

Wall-clock timings on shared cores measure the neighbours as much as the step. One thread timed
with `time.process_time` counts only this process's work, so the arms compare even while other
jobs run; the arms alternate round by round and the best round of each counts. Same model as
train_throughput.py (4 layers, hidden 256, FFN 1024, vocabulary 50,265, seq 128, batch 32, fp32,
the sparse MLM head at 15% masked positions), random tokens, no DeepSpeed. The peak is a 2048²
fp32 `torch.mm` on the same thread, also in CPU time; MFU uses the sparse-head FLOPs
(pipeline/pretrain/flops.py).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from result_record import BenchmarkRecord  # noqa: E402

ARMS = {"eager, per-tensor AdamW": (False, False), "eager, fused AdamW": (True, False),
        "compiled, fused AdamW": (True, True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with BenchmarkRecord("step_cpu_time", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    torch.set_num_threads(1)
    from pipeline.data.tokenizer import TokenizerInfo
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.flops import training_flops_per_token
    from pipeline.pretrain.model import build_model, parameter_groups

    clock = time.process_time
    batch, seq, vocab, masked = 32, 128, 50_265, 0.15
    torch.manual_seed(0)
    ids = torch.randint(5, vocab - 1, (batch, seq))
    labels = torch.full((batch, seq), -100)
    chosen = torch.rand(batch, seq) < masked
    labels[chosen] = ids[chosen]
    inputs = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    shape = ModelConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    base = build_model(shape, TokenizerInfo("bench", "none", vocab, 0, 2, 1, vocab - 1, ""), seq)
    arms = {}
    for name, (fused, compiled) in ARMS.items():
        model = copy.deepcopy(base).train()
        optimizer = torch.optim.AdamW(parameter_groups(model, 0.01), lr=5e-4, fused=fused or None)
        if compiled:
            model.compile()
        arms[name] = (model, optimizer)

    def step(model, optimizer) -> tuple[float, float]:
        start = clock()
        model(**inputs)["loss"].backward()
        middle = clock()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return middle - start, clock() - middle

    for model, optimizer in arms.values():  # warm-up: compilation, including the dynamic-size recompile
        for _ in range(3):
            step(model, optimizer)
    times = {name: [] for name in arms}
    for _ in range(a.rounds):
        for name, (model, optimizer) in arms.items():
            times[name].append(step(model, optimizer))
    n = 2048
    x, y = torch.randn(n, n), torch.randn(n, n)
    torch.mm(x, y)
    best = float("inf")
    for _ in range(3):
        start = clock()
        torch.mm(x, y)
        best = min(best, clock() - start)
    peak = 2 * n**3 / best
    flops = batch * seq * training_flops_per_token(layers=4, hidden=256, intermediate=1024, seq_len=seq, vocab=vocab,
                                                   masked_fraction=masked)
    print(f"peak: {peak / 1e9:.1f} GFLOP/s (one thread, CPU time); model FLOPs per step {flops / 1e9:.1f} G\n")
    print("| arm | forward + backward ms | clip + optimizer ms | step ms | MFU |")
    print("|---|---|---|---|---|")
    rows, mfu = [], {}
    for name, rounds in times.items():
        forward = min(f for f, _ in rounds)
        update = min(u for _, u in rounds)
        print(f"| {name} | {forward * 1e3:,.0f} | {update * 1e3:,.0f} | {(forward + update) * 1e3:,.0f} | "
              f"{flops / (forward + update) / peak:.0%} |")
        mfu[name] = flops / (forward + update) / peak
        rows.append({"arm": name, "forward + backward ms": f"{forward * 1e3:,.0f}",
                     "clip + optimizer ms": f"{update * 1e3:,.0f}", "step ms": f"{(forward + update) * 1e3:,.0f}",
                     "MFU": f"{mfu[name]:.0%}"})
    rec.table(f"one thread, CPU time, best of {a.rounds} rounds; peak {peak / 1e9:.1f} GFLOP/s, "
              f"{flops / 1e9:.1f} GFLOP per step", rows)
    best_arm = max(mfu, key=mfu.get)
    rec.headline("best MFU", f"{mfu[best_arm]:.0%} ({best_arm})", target="70%", met=mfu[best_arm] >= 0.70)


if __name__ == "__main__":
    main()
