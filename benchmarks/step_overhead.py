"""The training step's cost to the host: the pretrain command against the plain PyTorch loop, per step, on a model
whose compute is negligible (docs/benchmarks.md, "The step's host overhead").

    python benchmarks/step_overhead.py [--precisions fp32,bf16] [--steps 20] [--repeats 3] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpu_runs import Scale, clean_env, find_data, fresh_run, prepared_data, pretrain_config
from harness import BenchmarkRecord, Study, launch, toy_tokenizer, work_dir
from plain_loop import PROFILED_STEPS

# RoBERTa-large's 394 parameter tensors (24 layers of 16, 5 in the embeddings, 5 in the head) at 32 wide: a step
# launches RoBERTa-large's operators, each on tensors too small for its arithmetic to count.
MODEL = dict(num_hidden_layers=24, hidden_size=32, num_attention_heads=2, intermediate_size=128)
MICRO_BATCH = 4
SCALE = Scale("cpu", tiny=True)  # the GPU check's toy data: a 2,000-token BPE, 64-token shards
CALLS_TARGET, TIME_TARGET = 1.15, 1.1
ARMS = ("the pretrain command", "plain PyTorch loop")
STUDY = Study(
    "step_overhead", question="What does the pretrain command's step cost the host beyond a plain loop's?",
    metric="per step: operator calls, device reads (the host waiting for a value), milliseconds",
    baseline=f"the plain PyTorch loop (plain_loop.py) on the same model, micro batch and precision; targets: operator "
             f"calls ≤ {CALLS_TARGET}×, no device reads, step time ≤ {TIME_TARGET}×", arms=ARMS)


def ours(work: Path, made: dict[str, Any], precision: str, steps: int) -> dict[str, Any]:
    """The pretrain command, micro batches replayed in memory: the step time it logs over `steps` steps after as many
    warm-up steps, then the profile of the next steps (no log falls among them)."""
    config = pretrain_config(work, made, model=MODEL, packed=False,
                             train={"max_steps": 2 * steps + PROFILED_STEPS + 1, "global_batch_size": MICRO_BATCH,
                                    "micro_batch_size": MICRO_BATCH, "eval_sequences": MICRO_BATCH,
                                    "log_every": steps, "compile": False, "precision": precision})
    records, profile = fresh_run(config, work / f"ours-{precision}", SCALE, None, in_memory=True,
                                 profile_from=2 * steps)
    logged = next(r for r in records if r["step"] == 2 * steps and "train/samples_per_s" in r)
    return {"step_ms": 1e3 * MICRO_BATCH / logged["train/samples_per_s"], "profile": profile}


def plain(work: Path, vocab: int, precision: str, steps: int) -> dict[str, Any]:
    """plain_loop.py in a process of its own, timed and profiled as `ours`."""
    out = work / f"plain-{precision}.json"
    launch([sys.executable, "benchmarks/plain_loop.py", json.dumps([MODEL, SCALE.seq_len(False), MICRO_BATCH]),
            "--vocab", vocab, "--json", out, "--device", "cpu", "--precision", precision, "--steps", steps,
            "--warmup", steps], env=clean_env(SCALE), log=work / f"plain-{precision}.log")
    return json.loads(out.read_text())


def parameter_tensors(vocab: int) -> dict[str, int]:
    """Each arm's model's parameter tensors (RoBERTa-large has 394)."""
    from transformers import AutoModelForMaskedLM

    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import build_model, hf_config

    info = toy_tokenizer(vocab)
    keys, seq_len = ModelConfig(**MODEL), SCALE.seq_len(False)
    models = build_model(keys, info, seq_len), AutoModelForMaskedLM.from_config(hf_config(keys, info, seq_len))
    return {arm: len(list(model.parameters())) for arm, model in zip(ARMS, models, strict=True)}


def reads_text(profile: dict[str, Any]) -> str:
    """`397 (394 in Optimizer.step#AdamW.step, …)`: the reads per step, and how many in each range."""
    by_range = profile["device_reads_by_range"]
    return f"{profile['device_reads_per_step']:g}" + (" (" + ", ".join(
        f"{n:g} in {name}" for name, n in by_range.items()) + ")" if by_range else "")


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

    work = work_dir("step-overhead")
    made = prepared_data(work, SCALE, a.data)
    vocab = describe_tokenizer(load_tokenizer(made["tokenizer"])).vocab_size
    tensors, rows = parameter_tensors(vocab), []
    for precision in a.precisions:
        # The arms alternate, so a change of load on the shared cores falls on both; the time is each arm's median.
        runs = [(ours(work, made, precision, a.steps), plain(work, vocab, precision, a.steps))
                for _ in range(a.repeats)]
        measured = {arm: {"profile": each[0]["profile"], "times": sorted(r["step_ms"] for r in each),
                          "step_ms": statistics.median(r["step_ms"] for r in each)}
                    for arm, each in zip(ARMS, zip(*runs, strict=True), strict=True)}
        for arm, m in measured.items():
            top = m["profile"]["top"][0]
            rows.append({"precision": precision, "step": arm, "parameter tensors": tensors[arm],
                         "operator calls / step": f"{m['profile']['operator_calls_per_step']:,.0f}",
                         "device reads / step": reads_text(m["profile"]),
                         "ms / step: median (runs)":
                             f"{m['step_ms']:.1f} ({', '.join(f'{t:.1f}' for t in m['times'])})",
                         "top operator (calls / step, share of operator time)":
                             f"{top['name']} ({top['calls_per_step']:g}, {top['share']:.0%})"})
        mine, base = measured.values()
        calls = mine["profile"]["operator_calls_per_step"] / base["profile"]["operator_calls_per_step"]
        reads, slower = mine["profile"]["device_reads_per_step"], mine["step_ms"] / base["step_ms"]
        rec.headline(f"{precision}: operator calls per step, ours ÷ plain", f"{calls:.2f}×",
                     target=f"≤ {CALLS_TARGET}×", met=calls <= CALLS_TARGET)
        rec.headline(f"{precision}: device reads per step, ours", f"{reads:g}", target="none", met=reads == 0)
        rec.headline(f"{precision}: step time, ours ÷ plain", f"{slower:.2f}×", target=f"≤ {TIME_TARGET}×",
                     met=slower <= TIME_TARGET)
    rec.table(f"RoBERTa {MODEL['num_hidden_layers']} layers × {MODEL['hidden_size']}, vocabulary {vocab:,}, micro "
              f"batch {MICRO_BATCH} × {SCALE.seq_len(False)}, 1 thread; {a.repeats} runs of each arm, "
              f"alternated: time over {a.steps} steps after {a.steps} warm-up steps, operators and reads over the "
              f"{PROFILED_STEPS} steps after (the first run's)", rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated, of fp32 and bf16")
    p.add_argument("--steps", type=int, default=20, help="timed steps, after as many warm-up steps")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm, alternated")
    p.add_argument("--data", default=None, help="a folder laid out as /work/shared/data (default: found as the GPU "
                   "check finds it)")
    a = p.parse_args()
    a.precisions = a.precisions.split(",")
    if set(a.precisions) - {"fp32", "bf16"} or a.steps < PROFILED_STEPS + 1:
        p.error(f"--precisions: fp32 and/or bf16; --steps: at least {PROFILED_STEPS + 1} (no log among the profiled)")
    a.data = find_data(a.data)
    with STUDY.record() as rec:
        measure(a, rec)


if __name__ == "__main__":
    main()
