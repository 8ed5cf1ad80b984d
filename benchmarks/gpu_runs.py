"""The GPU check's pretraining runs, each through the pretrain command (`launchers/pretrain.py`) as a user runs it:
the data (a BPE and shards from a slice of IMDB), the throughput rows (the loader on, or off: `python
benchmarks/gpu_runs.py in-memory CONFIG` replays a few micro batches already on the device), and the run to the
end (killed with SIGKILL mid-run, resumed, compared, exported and fine-tuned on SST-2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import cycle, islice
from pathlib import Path
from typing import Any, NamedTuple

from harness import ROOT, make_shards, metrics, sample_corpus

MASKED = 0.15  # masking.probability: the FLOP model's masked fraction, as the trainer's MFU uses
IMDB = Path("corpus") / "imdb-reviews.jsonl.zst"
SST2 = Path("glue") / "SST-2"
# name: (model keys, seq_len, micro batch, doc-packed); the published shapes, measured in this order of value.
SHAPES = {
    "RoBERTa-large": (dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
                      512, 16, False),
    "ModernBERT-base": (dict(architecture="modernbert", num_hidden_layers=22, hidden_size=768, num_attention_heads=12,
                             intermediate_size=1152, local_attention=128), 1024, 32, True),
    "RoBERTa-base": (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
                     512, 32, False),
}
TINY_SHAPE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
# The run to the end: a small ModernBERT (base's proportions: FFN 1.5 × hidden, 64 per head) for a few hundred steps.
E2E_MODEL = dict(architecture="modernbert", num_hidden_layers=6, hidden_size=384, num_attention_heads=6,
                 intermediate_size=576, local_attention=128, global_attn_every_n_layers=3,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
WORLD_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
IN_MEMORY_BATCHES = 4  # distinct micro batches replayed by a loader-off run


class Scale(NamedTuple):
    """Sizes of the GPU run, or of the toy run that rehearses the same code on CPU."""

    device: str
    tiny: bool

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def precision(self) -> str:
        return "bf16" if self.cuda else "fp32"  # bf16 is slow where the CPU has no native bf16

    @property
    def packed_attention(self) -> str:
        # FlexAttention has no backward on CPU: the toy run trains packed rows with SDPA's dense mask
        return "flex_attention" if self.cuda else "sdpa"

    def seq_len(self, packed: bool) -> int:
        return 64 if self.tiny else (1024 if packed else 512)


def find_data(given: str | None) -> Path | None:
    """The data folder (/work/shared/data's layout): `--data`, else `shared/data` in the checkout (where the
    device tool carries a checkout's `shared/`), else `../shared/data` beside it; None where there is none."""
    if given:
        return Path(given).resolve()
    return next((p for p in (ROOT / "shared" / "data", ROOT.parent / "shared" / "data") if (p / IMDB).is_file()), None)


def clean_env(scale: Scale) -> dict[str, str]:
    """Each run is a world of its own: not this process's (its rank variables and port are taken)."""
    env = {k: v for k, v in os.environ.items() if k not in WORLD_VARIABLES}
    if not scale.cuda:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


# ---------------------------------------------------------------- data

def make_data(folder: Path, scale: Scale, data: Path | None) -> dict[str, Any]:
    """A tokenizer and shards (plain and doc-packed) written by the pipeline's own stages from a slice of IMDB."""
    from pipeline.data.tokenizer import train_tokenizer

    source = None if data is None else str(data / IMDB)
    source, texts, corpus = sample_corpus(source, 300 if scale.tiny else 20_000, folder)
    tokenizer = folder / "tokenizer"
    longest = max(scale.seq_len(True), scale.seq_len(False))
    train_tokenizer(texts, "bpe", 2_000 if scale.tiny else 50_265, tokenizer, model_max_length=longest)
    shards = {pack: str(make_shards(corpus, tokenizer, folder / f"shards-{pack}", scale.seq_len(packed), pack=pack,
                                    val_fraction=0.02, workers=1 if scale.tiny else 8))
              for pack, packed in (("full", False), ("doc-packed", True))}
    return {"source": source, "documents": len(texts), "tokenizer": str(tokenizer), "shards": shards}


def prepared_data(folder: Path, scale: Scale, data: Path | None) -> dict[str, Any]:
    """`make_data`'s result, made once per folder: a rerun on a warm machine with the same `--work-dir` reuses it
    (its `data.json`, written last, says what was made from what)."""
    record = folder / "data.json"
    wanted = {"tiny": scale.tiny, "data": str(data) if data else None}
    if record.is_file() and (found := json.loads(record.read_text())).get("made_from") == wanted:
        return {**found, "reused": True}
    made = {**make_data(folder, scale, data), "made_from": wanted}
    record.write_text(json.dumps(made))
    return made


# ---------------------------------------------------------------- one pretraining run

def pretrain_config(folder: Path, made: dict[str, Any], *, model: dict, packed: bool,
                    **sections: dict) -> dict[str, Any]:
    """A pretrain config on the prepared shards; `sections` override keys section by section."""
    config: dict[str, Any] = {
        "model": model,
        "data": {"shards": made["shards"]["doc-packed" if packed else "full"], "tokenizer": made["tokenizer"],
                 "num_workers": 0, "cache_dir": str(folder / "token_cache")},
        "optimizer": {"lr": 5e-4, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01},
        "schedule": {"warmup_steps": 2},
        "train": {"export": False, "zero_stage": 0},
        "checkpoint": {"every": 10**6},
        "tracking": {"enabled": False},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def start_run(config: dict[str, Any], run_dir: Path, env: dict[str, str], in_memory: bool = False) -> subprocess.Popen:
    """Start the pretrain command on `config` (written beside `run_dir`); its output goes to `run_dir`.log."""
    config = {**config, "train": {**config["train"], "output_dir": str(run_dir)}}
    path = run_dir.parent / f"{run_dir.name}.json"
    path.write_text(json.dumps(config, indent=1))
    command = ([sys.executable, __file__, "in-memory", str(path)] if in_memory
               else [sys.executable, "launchers/pretrain.py", "--config", str(path)])
    # its own session: a kill reaches its loader workers too
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:  # the child keeps its own copy open
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(process: subprocess.Popen, run_dir: Path, timeout: float | None) -> None:
    """Wait for a run (killing it, and its loader workers, after `timeout` s); raise with its last words unless it
    ended well: a run that hangs at exit (its loader workers left behind) or fails its final evaluation fails."""
    try:
        process.wait(timeout=None if timeout is None else max(1.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise TimeoutError(f"the run was still going after {timeout:.0f} s (killed); its log ends: "
                           f"{last_words(run_dir)}") from None
    if process.returncode != 0:
        raise RuntimeError(f"the pretrain command exited {process.returncode}: {last_words(run_dir)}")


def last_words(run_dir: Path) -> str:
    log = run_dir.parent / f"{run_dir.name}.log"
    return log.read_text(errors="replace").strip()[-1500:] if log.exists() else "(no log)"


def run(config: dict[str, Any], run_dir: Path, env: dict[str, str], timeout: float | None,
        in_memory: bool = False) -> None:
    """A fresh run to its end (a folder left by an earlier check would make it resume)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    return finish(start_run(config, run_dir, env, in_memory), run_dir, timeout)


def run_in_memory(config_path: str) -> None:
    """The pretrain command with the loader off: its first micro batches, already on the device, replayed.

    The run is the command's own (engine, compile, step, logging, evaluation, checkpoint); only the training
    loader is swapped, at the one seam the trainer reads batches through (`PretrainData.loader`), for a cycle
    over `IN_MEMORY_BATCHES` micro batches that the real loader made once, in process.
    """
    import torch

    from pipeline.commands.pretrain import main
    from pipeline.pretrain.batches import PretrainData

    real_loader, ready = PretrainData.loader, []

    def replay(self, **kwargs):
        if not ready:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            self.num_workers = 0
            made = real_loader(self, **kwargs)
            ready.extend({k: v.to(device) for k, v in b.items()} for b in islice(made, IN_MEMORY_BATCHES))
        return cycle(ready)

    PretrainData.loader = replay
    main(["--config", config_path])


# ---------------------------------------------------------------- throughput rows

def throughput_row(folder: Path, made: dict[str, Any], scale: Scale, name: str, compiled: bool, loader: bool,
                   peaks: dict[str, Any] | None, timeout: float | None) -> dict[str, Any]:
    """One row: the model `name` trained for a few dozen steps; tokens/s and MFU over the steps after warmup."""
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.flops import model_flops_per_token
    from pipeline.pretrain.model import hf_config

    keys, seq_len, batch, packed = SHAPES[name]
    if scale.tiny:
        keys, seq_len, batch = {**TINY_SHAPE, **({"architecture": "modernbert"} if packed else {})}, 64, 4
    # ModernBERT's own attention dropout is 0 (FlexAttention has none)
    model = {**keys, **({"attn_implementation": scale.packed_attention, "attention_probs_dropout_prob": 0.0}
                        if packed else {})}
    steps, skip, every = (6, 2, 2) if scale.tiny else (40, 10, 5)
    config = pretrain_config(folder, made, model=model, packed=packed,
                             data={"num_workers": (1 if scale.tiny else 2) if loader else 0},
                             optimizer={"fused": scale.cuda},
                             train={"max_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
                                    "eval_sequences": batch, "log_every": every, "compile": compiled,
                                    "precision": "bf16", "zero_stage": 0})
    run_dir = folder / f"{name}-{'compiled' if compiled else 'eager'}-{'loader' if loader else 'in-memory'}"
    try:
        run(config, run_dir, clean_env(scale), timeout, in_memory=not loader)
        records = [r for r in metrics(run_dir) if "train/loss" in r]
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)  # a large model's checkpoint is gigabytes
    seconds, counted, real, previous = 0.0, 0, 0.0, 0
    for r in records:  # a record covers the steps since the previous one
        if previous >= skip:
            span = (r["step"] - previous) * batch / r["train/samples_per_s"]
            seconds, counted = seconds + span, counted + r["step"] - previous
            real += span * r["train/tokens_per_s"]
        previous = r["step"]
    if not counted:
        raise RuntimeError(f"no step after the {skip} warm-up steps was logged")
    info = describe_tokenizer(load_tokenizer(made["tokenizer"]))
    per_token = model_flops_per_token(hf_config(ModelConfig(**keys), info, seq_len), seq_len, MASKED)
    tokens_per_s = counted * batch * seq_len / seconds  # positions, padding included: what the FLOPs count
    achieved = tokens_per_s * per_token / 1e12
    measured = (peaks or {}).get("peak_tflops", {}).get("bf16")
    nominal = (peaks or {}).get("nominal_tflops")
    return {"tokens_per_s": tokens_per_s, "real_tokens_per_s": real / seconds, "model_tflops": achieved,
            "mfu_measured_peak": achieved / measured if measured else None,
            "mfu_nominal_peak": achieved / nominal if nominal else None, "attention": model.get("attn_implementation",
                                                                                                 "sdpa"),
            "seq_len": seq_len, "micro_batch": batch, "steps_counted": counted,
            "loader_workers": config["data"]["num_workers"] if loader else None}


# ---------------------------------------------------------------- the run to the end

def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in metrics(run_dir) if "train/loss" in r}


def end_to_end(folder: Path, made: dict[str, Any], scale: Scale, data: Path | None,
               timeout: float | None) -> dict[str, Any]:
    """Pretrain (uninterrupted, and killed -9 mid-run then resumed), compare losses, export, fine-tune on SST-2."""
    if data is None or not (data / SST2 / "train.tsv").is_file():
        raise FileNotFoundError(f"no SST-2 under {data}: give --data, a folder laid out as /work/shared/data "
                                "(corpus/imdb-reviews.jsonl.zst, glue/SST-2/train.tsv and dev.tsv)")
    steps, every, kill_after = (30, 10, 15) if scale.tiny else (300, 100, 150)
    batch = 8 if scale.tiny else 32
    model = ({**TINY_SHAPE, "architecture": "modernbert", "local_attention": 16} if scale.tiny else E2E_MODEL)
    # SDPA's dense document mask: FlexAttention's training path has yet to run on a GPU (the throughput rows try
    # it), and the run to the end must not hang on it
    config = pretrain_config(folder, made, model={**model, "attn_implementation": "sdpa"}, packed=True,
                             data={"num_workers": 0 if scale.tiny else 2},
                             optimizer={"lr": 1e-3, "fused": scale.cuda},
                             schedule={"warmup_steps": steps // 10, "decay": "linear"},
                             train={"max_steps": steps, "global_batch_size": batch, "micro_batch_size": batch,
                                    "eval_sequences": 4 * batch, "log_every": 1, "eval_every": every,
                                    "precision": scale.precision, "zero_stage": 1},
                             checkpoint={"every": every, "keep_last": 2})
    env, started = clean_env(scale), time.perf_counter()
    limit = min(timeout or 600, 600)
    reference_dir, resumed_dir = folder / "e2e-uninterrupted", folder / "e2e-killed"
    for stale in (reference_dir, resumed_dir, folder / "sst2"):  # from an earlier check in the same folder
        shutil.rmtree(stale, ignore_errors=True)
    reference = start_run(config, reference_dir, env)  # alongside: the comparison needs both, not their speed
    resumed_config = {**config, "train": {**config["train"], "export": True}}
    killed = start_run(resumed_config, resumed_dir, env)
    kill_step = kill_when(killed, resumed_dir, kill_after, limit)
    resumed = start_run(resumed_config, resumed_dir, env)
    finish(reference, reference_dir, limit - (time.perf_counter() - started))
    finish(resumed, resumed_dir, limit - (time.perf_counter() - started))
    pretrain_seconds = time.perf_counter() - started

    a, b = losses(reference_dir), losses(resumed_dir)
    if sorted(a) != list(range(1, steps + 1)) or sorted(b) != sorted(a):
        raise AssertionError(f"logged steps differ: uninterrupted {len(a)}, killed and resumed {len(b)} of {steps}")
    worst = max(abs(a[s] - b[s]) for s in a)
    resumes = [r for r in metrics(resumed_dir) if "resumed_from" in r]
    # CPU kernels are deterministic, so a resume must reproduce every loss exactly; CUDA's atomics
    # (embedding and gather backward) may differ in the last bits between any two runs
    tolerance = 0.0 if not scale.cuda else 2e-3 * max(a.values())
    if not resumes or not worst <= tolerance:
        source = resumes[-1]["resumed_from"] if resumes else "nowhere (no resume was logged)"
        raise AssertionError(f"killed at step {kill_step}, resumed from {source}: largest loss difference "
                             f"{worst:.3g} > {tolerance:.3g}")
    export = resumed_dir / "export"
    if not (export / "config.json").is_file():
        raise AssertionError(f"no export at {export}")
    finetuned = fine_tune(folder, export, scale, data, env, limit - (time.perf_counter() - started))
    return {"steps": steps, "killed_at_step": kill_step, "resumed_at_step": resumes[-1]["step"],
            "max_abs_loss_difference": worst, "identical_losses": worst == 0.0, "tolerance": tolerance,
            "final_loss": a[steps], "first_loss": a[1], "pretrain_seconds": round(pretrain_seconds, 1),
            "export": "ok", **finetuned}


def kill_when(process: subprocess.Popen, run_dir: Path, after: int, timeout: float) -> int:
    """SIGKILL the run (and its loader workers) once it has checkpointed and logged a step past `after`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the run to be killed ended first (exit {process.returncode}): {last_words(run_dir)}")
        records = metrics(run_dir)
        saved = [r["step"] for r in records if "checkpoint" in r]
        logged = [r["step"] for r in records if "train/loss" in r]
        if saved and logged and logged[-1] > after:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return logged[-1]
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    raise TimeoutError(f"the run never logged step {after} within {timeout:.0f} s: {last_words(run_dir)}")


def fine_tune(folder: Path, export: Path, scale: Scale, data: Path, env: dict[str, str],
              timeout: float) -> dict[str, Any]:
    """The fine-tune command on SST-2 from the export, one short epoch; the dev accuracy."""
    out = folder / "sst2"
    examples, seq_len = (64, 64) if scale.tiny else (8_000, 128)
    command = [sys.executable, "launchers/finetune.py", "--config", "sst2", "--model", str(export),
               "--set", f"data.glue_dir={json.dumps(str(data / 'glue'))}", "--set", f"train.output_dir={out}",
               "--set", f"data.max_train_examples={examples}", "--set", f"data.max_seq_len={seq_len}",
               "--set", "train.epochs=1", "--set", "train.learning_rate=1e-4", "--set", "tracking.enabled=false",
               "--set", f"train.precision={scale.precision}"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(1.0, timeout))
    if done.returncode != 0:
        raise RuntimeError(f"the fine-tune command exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    found = json.loads((out / "metrics.json").read_text())
    return {"sst2_train_examples": examples, "sst2_seconds": round(time.perf_counter() - started, 1),
            "sst2_metric": found["metric"], "sst2_dev": found[found["metric"]]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The GPU check's loader-off run (gpu_check.py starts it).")
    p.add_argument("mode", choices=["in-memory"])
    p.add_argument("config", help="a pretrain config file")
    return p


if __name__ == "__main__":
    run_in_memory(build_parser().parse_args().config)
