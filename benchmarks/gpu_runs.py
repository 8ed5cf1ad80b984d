"""The GPU check's pretraining runs, each through the pretrain command as a user runs it: the data, the throughput
rows (loader off: `python benchmarks/gpu_runs.py in-memory CONFIG` replays micro batches already on the device), and
the run to the end (killed with SIGKILL mid-run, resumed, compared, exported and fine-tuned on SST-2)."""

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

from harness import ROOT, finetune_command, metrics, sample_corpus, set_args
from plain_loop import PROFILED_STEPS

MASKED = 0.15  # masking.probability: the FLOP model's masked fraction, as the trainer's MFU uses
IMDB = Path("corpus") / "imdb-reviews.jsonl.zst"
SST2 = Path("glue") / "SST-2"
# name: (model keys, seq_len, micro batch, doc-packed); the published shapes, measured in this order of value.
SHAPES = {
    "RoBERTa-large": (dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096),
                      512, 32, False),
    "ModernBERT-base": (dict(architecture="modernbert", num_hidden_layers=22, hidden_size=768, num_attention_heads=12,
                             intermediate_size=1152, local_attention=128), 1024, 32, True),
    "RoBERTa-base": (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
                     512, 32, False),
}
TINY_SHAPE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
# The run to the end: ModernBERT-small, base's proportions (GeGLU feed-forward 1.5 × hidden, 64 per head, a global
# layer every third) at 8 layers × 512; its size and steps are an estimate, given in docs/gpu-nodes.md.
E2E_MODEL = dict(architecture="modernbert", num_hidden_layers=8, hidden_size=512, num_attention_heads=8,
                 intermediate_size=768, local_attention=128, global_attn_every_n_layers=3,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


class CheckFailed(AssertionError):
    """A failed check that still measured: its `figures` go into the record beside the error."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


class RunSizes(NamedTuple):
    """The run to the end's sizes: a checkpoint every `checkpoint_every` steps, the kill past step `kill_after`, the
    uninterrupted reference stopped past `compare_to`; each SST-2 fine-tuning reads `sst2_examples` sentences."""

    steps: int
    batch: int
    checkpoint_every: int
    kill_after: int
    compare_to: int
    sst2_examples: int
    sst2_seq_len: int
    sst2_epochs: int


FULL_RUN = RunSizes(steps=1_600, batch=64, checkpoint_every=100, kill_after=150, compare_to=200, sst2_examples=8_000,
                    sst2_seq_len=128, sst2_epochs=3)
TINY_RUN = RunSizes(steps=30, batch=8, checkpoint_every=10, kill_after=15, compare_to=20, sst2_examples=64,
                    sst2_seq_len=64, sst2_epochs=1)
# Each arm's grid, chosen on the held-out slice of train: a small encoder fine-tunes best at 1e-4–3e-4 pretrained
# and higher from scratch (the CPU recipe's arms chose within 1e-4–3e-3).
SST2_SWEEP, SST2_SEEDS = "train.learning_rate=1e-4,3e-4,1e-3", "1,2,3"
TRANSFER_SECONDS = 180  # kept for the export's fine-tuning: 5 trainings of ~18 s and starts (120 s ran out on an H100)
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

    @property
    def run(self) -> RunSizes:
        return TINY_RUN if self.tiny else FULL_RUN


def shape(name: str, scale: Scale) -> tuple[dict[str, Any], int, int, bool]:
    """SHAPES[name] at the scale: (model keys, seq_len, micro batch, doc-packed); the toy shape on a tiny run."""
    keys, seq_len, batch, packed = SHAPES[name]
    if scale.tiny:
        return {**TINY_SHAPE, **({"architecture": "modernbert"} if packed else {})}, 64, 4, packed
    return keys, seq_len, batch, packed


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
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage
    from pipeline.data.tokenizer import train_tokenizer

    source = None if data is None else str(data / IMDB)
    source, texts, corpus = sample_corpus(source, 300 if scale.tiny else 20_000, folder)
    tokenizer = folder / "tokenizer"
    longest = max(scale.seq_len(True), scale.seq_len(False))
    train_tokenizer(texts, "bpe", 2_000 if scale.tiny else 50_265, tokenizer, model_max_length=longest)
    shards = {pack: str(folder / f"shards-{pack}") for pack in ("full", "doc-packed")}
    for pack, out in shards.items():
        run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tokenizer), out=out, quiet=True, pack=pack,
                                     seq_len=scale.seq_len(pack != "full"), val_fraction=0.02,
                                     workers=1 if scale.tiny else 8))
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


def start_run(config: dict[str, Any], run_dir: Path, env: dict[str, str], in_memory: bool = False,
              profile_from: int | None = None) -> subprocess.Popen:
    """Start the pretrain command on `config` (written beside `run_dir`); its output goes to `run_dir`.log. Loader
    off (`in_memory`), `profile_from` profiles the steps after that one (`run_in_memory`)."""
    config = {**config, "train": {**config["train"], "output_dir": str(run_dir)}}
    path = run_dir.parent / f"{run_dir.name}.json"
    path.write_text(json.dumps(config, indent=1))
    profiled = [] if profile_from is None else ["--profile-from", str(profile_from)]
    return launch([sys.executable, __file__, "in-memory", str(path), *profiled] if in_memory
                  else [sys.executable, "launchers/pretrain.py", "--config", str(path)], run_dir, env)


def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start `command` from the repository root, its output to `run_dir`.log, in a session of its own: a kill
    reaches its loader workers too."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:  # the child keeps its own copy open
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(process: subprocess.Popen, run_dir: Path, timeout: float | None) -> None:
    """Wait for a run (killing it, and its loader workers, after `timeout` s); raise with its last words unless it
    ended well: a run that hangs at exit (its loader workers left behind) or fails its final evaluation fails."""
    try:
        process.wait(timeout=None if timeout is None else max(1.0, timeout))
    except subprocess.TimeoutExpired:
        kill(process)
        raise TimeoutError(f"{run_dir.name} was still going after {timeout:.0f} s (killed); its log ends: "
                           f"{last_words(run_dir)}") from None
    if process.returncode != 0:
        raise RuntimeError(f"{run_dir.name} exited {process.returncode}: {last_words(run_dir)}")


def kill(process: subprocess.Popen) -> None:
    """SIGKILL a process started by `launch` and everything in its session (its loader workers)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def last_words(run_dir: Path) -> str:
    log = run_dir.parent / f"{run_dir.name}.log"
    return log.read_text(errors="replace").strip()[-1500:] if log.exists() else "(no log)"


def run_in_memory(config_path: str, profile_from: int | None = None) -> None:
    """The pretrain command with its loader (`PretrainData.loader`) swapped for `IN_MEMORY_BATCHES` micro batches the
    real one made, replayed on the device; the `PROFILED_STEPS` after `profile_from` go to `<config>.profile.json`."""
    import torch
    from plain_loop import PROFILED_STEPS, profiler, summary

    from pipeline.commands.pretrain import main
    from pipeline.pretrain.batches.stretch_data import PretrainData

    real_loader, ready = PretrainData.loader, []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    prof = profiler(device)

    def replay(self, **kwargs):
        if not ready:
            self.num_workers = 0
            made = real_loader(self, **kwargs)
            where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else "cpu"
            ready.extend({k: v.to(where) for k, v in b.items()} for b in islice(made, IN_MEMORY_BATCHES))
        for served, batch in enumerate(cycle(ready)):
            # the trainer asks for a step's batch once the step before is queued: the window is whole steps
            if profile_from is not None and served in (profile_from, profile_from + PROFILED_STEPS):
                sync()
                if served == profile_from:
                    prof.start()
                else:
                    prof.stop()
                    Path(config_path).with_suffix(".profile.json").write_text(
                        json.dumps(summary(prof, PROFILED_STEPS, device)))
            yield batch

    PretrainData.loader = replay
    main(["--config", config_path])


# ---------------------------------------------------------------- throughput rows

def fresh_run(config: dict[str, Any], run_dir: Path, scale: Scale, timeout: float | None, *, in_memory: bool,
              profile_from: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A run in a new `run_dir` (a folder left behind would make it resume), removed after (a large model's
    checkpoint is gigabytes): its logged training records and its profile (None without `profile_from`)."""
    profile = run_dir.parent / f"{run_dir.name}.profile.json"
    try:
        shutil.rmtree(run_dir, ignore_errors=True)
        profile.unlink(missing_ok=True)
        finish(start_run(config, run_dir, clean_env(scale), in_memory, profile_from), run_dir, timeout)
        records = metrics(run_dir, "train/loss")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return records, json.loads(profile.read_text()) if profile.is_file() else None


def throughput_row(folder: Path, made: dict[str, Any], scale: Scale, name: str, compiled: bool, loader: bool,
                   peaks: dict[str, Any] | None, timeout: float | None) -> dict[str, Any]:
    """The model `name` trained by the pretrain command for a few dozen steps: tokens/s and MFU after warmup."""
    keys, seq_len, batch, packed = shape(name, scale)
    # ModernBERT's own attention dropout is 0 (FlexAttention has none)
    model = {**keys, **({"attn_implementation": scale.packed_attention, "attention_probs_dropout_prob": 0.0}
                        if packed else {})}
    steps, skip, every = (6, 2, 2) if scale.tiny else (40, 10, 5)
    profiled = None if loader else steps
    config = pretrain_config(folder, made, model=model, packed=packed,
                             data={"num_workers": (1 if scale.tiny else 2) if loader else 0},
                             train={"max_steps": steps + (0 if loader else PROFILED_STEPS + 1),
                                    "global_batch_size": batch, "micro_batch_size": batch,
                                    "eval_sequences": batch, "log_every": every, "compile": compiled,
                                    "precision": "bf16", "zero_stage": 0})
    run_dir = folder / f"{name}-{'compiled' if compiled else 'eager'}-{'loader' if loader else 'in-memory'}"
    records, profile = fresh_run(config, run_dir, scale, timeout, in_memory=not loader, profile_from=profiled)
    seconds, counted, real, previous = 0.0, 0, 0.0, 0
    for r in (r for r in records if r["step"] <= steps):  # a record covers the steps since the previous one
        if previous >= skip:
            span = (r["step"] - previous) * batch / r["train/samples_per_s"]
            seconds, counted = seconds + span, counted + r["step"] - previous
            real += span * r["train/tokens_per_s"]
        previous = r["step"]
    if not counted:
        raise RuntimeError(f"no step after the {skip} warm-up steps was logged")
    rates = {"tokens_per_s": counted * batch * seq_len / seconds,  # positions, padding included
             "real_tokens_per_s": real / seconds}
    return {**rates, **utilisation(rates, keys, seq_len, made, peaks, masked=MASKED),
            "attention": model.get("attn_implementation", "sdpa"), "seq_len": seq_len, "micro_batch": batch,
            "steps_counted": counted, "loader_workers": config["data"]["num_workers"] if loader else None,
            "profile": profile}


def plain_row(folder: Path, made: dict[str, Any], scale: Scale, name: str, compiled: bool,
              peaks: dict[str, Any] | None, timeout: float | None) -> dict[str, Any]:
    """One row: the same model in the plain PyTorch loop (plain_loop.py), run as a process of its own."""
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

    keys, seq_len, batch, _ = shape(name, scale)
    vocab = describe_tokenizer(load_tokenizer(made["tokenizer"])).vocab_size
    out = folder / f"{name}-plain-{'compiled' if compiled else 'eager'}"
    result = out.parent / f"{out.name}.result.json"
    result.unlink(missing_ok=True)
    steps, warmup = (4, 2) if scale.tiny else (30, 10)
    finish(launch([sys.executable, "benchmarks/plain_loop.py", json.dumps([keys, seq_len, batch]), "--vocab",
                   str(vocab), "--json", str(result), "--device", scale.device, "--steps", str(steps),
                   "--warmup", str(warmup), *(["--compile"] if compiled else [])], out, clean_env(scale)),
           out, timeout)
    row = json.loads(result.read_text())
    # the plain loop trains the full head on every position: as trained is the anchors' convention
    return {**row, **utilisation(row, keys, seq_len, made, peaks, masked=None)}


def utilisation(rates: dict[str, float], keys: dict[str, Any], seq_len: int, made: dict[str, Any],
                peaks: dict[str, Any] | None, masked: float | None) -> dict[str, Any]:
    """MFU two ways, of the nominal peak (and as trained of the measured one too): as trained (the head on the
    `masked` share of the real tokens; None: a full head) and by the anchors' convention (a full head on every
    position, padding included)."""
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.flops import model_flops_per_token
    from pipeline.models.architectures.hf_model import hf_config

    config = hf_config(ModelConfig(**keys), describe_tokenizer(load_tokenizer(made["tokenizer"])), seq_len)
    as_trained = rates["real_tokens_per_s"] * model_flops_per_token(config, seq_len, masked) / 1e12
    full_head = rates["tokens_per_s"] * model_flops_per_token(config, seq_len, None) / 1e12
    measured, nominal = (peaks or {}).get("peak_tflops", {}).get("bf16"), (peaks or {}).get("nominal_tflops")
    return {"model_tflops": as_trained, "model_tflops_full_head": full_head,
            "mfu_nominal_peak": as_trained / nominal if nominal else None,
            "mfu_full_head_nominal_peak": full_head / nominal if nominal else None,
            "mfu_measured_peak": as_trained / measured if measured else None}


# ---------------------------------------------------------------- the run to the end

def losses(run_dir: Path) -> dict[int, float]:
    """step → training loss; a step logged again after a resume keeps its newer loss."""
    return {r["step"]: r["train/loss"] for r in metrics(run_dir, "train/loss")}


class RunToTheEnd:
    """The run to the end (docs/gpu-nodes.md): two steps of the check, `pretrain` then `transfer`; `close` stops what
    still runs. No speed is measured, so the GPU is shared: the reference beside the run until it is stopped, then
    the from-scratch arm and the baseline (CPU) beside the rest of the pretraining; the export's arm follows it."""

    def __init__(self, folder: Path, made: dict[str, Any], scale: Scale, data: Path | None) -> None:
        self.folder, self.made, self.scale, self.data = folder, made, scale, data
        self.sizes, self.env = scale.run, clean_env(scale)
        self.reference_dir, self.run_dir = folder / "e2e-uninterrupted", folder / "e2e-killed"
        self.before_kill_dir = folder / "e2e-before-kill"
        """What the run logged before the kill: the resume cuts its log back to the checkpoint."""
        self.sst2 = folder / "sst2"
        self.processes: dict[str, subprocess.Popen] = {}
        self.source: Path | None = None
        """What the export's arm fine-tunes once the run has ended or been stopped: its export, or its folder."""

    def config(self) -> dict[str, Any]:
        sizes, tiny = self.sizes, self.scale.tiny
        model = {**TINY_SHAPE, "architecture": "modernbert", "local_attention": 16} if tiny else E2E_MODEL
        # SDPA's dense document mask: FlexAttention's training path has yet to run on a GPU (the throughput rows try
        # it), and the run to the end must not hang on it
        return pretrain_config(self.folder, self.made, model={**model, "attn_implementation": "sdpa"}, packed=True,
                               data={"num_workers": 0 if tiny else 2},
                               masking={"probability": 0.3},  # ModernBERT's rate
                               optimizer={"lr": 1e-3},
                               schedule={"warmup_steps": sizes.steps // 16, "decay": "linear"},
                               train={"max_steps": sizes.steps, "global_batch_size": sizes.batch,
                                      "micro_batch_size": sizes.batch, "eval_sequences": 4 * sizes.batch,
                                      "log_every": 1, "eval_every": sizes.steps // 4, "export": True,
                                      "precision": self.scale.precision, "zero_stage": 1},
                               checkpoint={"every": sizes.checkpoint_every, "keep_last": 2})

    def pretrain(self, seconds: float | None) -> dict[str, Any]:
        """The run and its reference; past `seconds` (less the fine-tuning's share) the run is stopped by SIGTERM,
        which checkpoints, and the export's arm fine-tunes that checkpoint."""
        if self.data is None or not (self.data / SST2 / "train.tsv").is_file():
            raise FileNotFoundError(f"no SST-2 under {self.data}: give --data, a folder laid out as /work/shared/data "
                                    "(corpus/imdb-reviews.jsonl.zst, glue/SST-2/train.tsv and dev.tsv)")
        for stale in (self.reference_dir, self.run_dir, self.before_kill_dir, self.sst2):  # from an earlier check
            shutil.rmtree(stale, ignore_errors=True)
        sizes, config, started = self.sizes, self.config(), time.monotonic()
        ends = started + (600 if seconds is None else seconds - (0 if self.scale.tiny else TRANSFER_SECONDS))

        def left() -> float:
            return ends - time.monotonic()

        try:
            self.processes["reference"] = start_run(config, self.reference_dir, self.env)
            kill_step = signal_after(start_run(config, self.run_dir, self.env), self.run_dir, sizes.kill_after,
                                     left(), signal.SIGKILL)
            self.before_kill_dir.mkdir()
            shutil.copy(self.run_dir / "metrics.jsonl", self.before_kill_dir / "metrics.jsonl")
            self.processes["run"] = start_run(config, self.run_dir, self.env)  # the same command resumes it
            signal_after(self.processes["reference"], self.reference_dir, sizes.compare_to, left(), signal.SIGTERM,
                         last_step=sizes.steps)
            self.start_beside()
            completed = wait_or_stop(self.processes["run"], self.run_dir, left())
            export = self.run_dir / "export"
            self.source = export if (export / "config.json").is_file() else self.run_dir
        except BaseException:
            for name in ("reference", "run"):
                if name in self.processes:
                    kill(self.processes[name])
            raise
        a, b = losses(self.reference_dir), losses(self.run_dir)
        compared = sorted(a)
        if compared != list(range(1, len(a) + 1)) or len(a) < sizes.compare_to or not set(a) <= set(b):
            raise AssertionError(f"logged steps differ: the uninterrupted run logged {len(a)} (from step "
                                 f"{min(a, default=None)}), the resumed one {len(b)}; {sizes.compare_to} compared")
        records = metrics(self.run_dir)
        resumes = [r for r in records if "resumed_from" in r]
        done = max(b)
        evals = [r for r in records if "eval/mlm_loss" in r]
        rates = sorted(r["train/tokens_per_s"] for r in records if "train/tokens_per_s" in r)
        # The resume is judged against the run's own steps logged before the kill, which began from the state the
        # checkpoint saved: on CUDA they differ only by the atomics of the steps since (at most `kill_after` −
        # `checkpoint_every`), where the uninterrupted run has drifted for every step from the first.
        before_kill = losses(self.before_kill_dir)
        redone = sorted(set(before_kill) & {s for s in b if resumes and s > resumes[-1]["step"]})
        figures = {"steps": sizes.steps, "steps_done": done, "completed": completed, "killed_at_step": kill_step,
                   "resumed_at_step": resumes[-1]["step"] if resumes else None, "compared_steps": len(a),
                   "max_abs_loss_difference": max(abs(a[s] - b[s]) for s in a),
                   "redone_steps": len(redone),
                   "max_abs_redone_loss_difference": max((abs(before_kill[s] - b[s]) for s in redone), default=None),
                   "first_loss": b[1], "final_loss": b[done],
                   "eval_mlm_loss": {r["step"]: r["eval/mlm_loss"] for r in evals},
                   "median_tokens_per_s": rates[len(rates) // 2] if rates else None,
                   "tokens_per_step": sizes.batch * self.scale.seq_len(True),
                   "export": "the run's own" if completed else "by the fine-tune command, from the newest checkpoint",
                   "pretrain_seconds": round(time.monotonic() - started, 1)}
        figures["identical_losses"] = figures["max_abs_loss_difference"] == 0.0
        # CPU kernels are deterministic, so a resume reproduces every loss exactly, the uninterrupted run's too;
        # CUDA's atomics (embedding and attention backward) make any two runs differ, and the difference grows
        figures["tolerance"] = tolerance = 0.0 if not self.scale.cuda else 2e-3 * max(a.values())
        worst, against = ((figures["max_abs_loss_difference"], f"the uninterrupted run's, steps 1–{len(a)}")
                          if not self.scale.cuda else
                          (figures["max_abs_redone_loss_difference"], f"its own {len(redone)} steps before the kill"))
        if not resumes or worst is None or not worst <= tolerance:
            source = resumes[-1]["resumed_from"] if resumes else "nowhere (no resume was logged)"
            raise CheckFailed(f"killed at step {kill_step}, resumed from {source}: largest loss difference from "
                              f"{against}: {worst if worst is None else f'{worst:.3g}'} > {tolerance:.3g}", figures)
        if completed and not (self.run_dir / "export" / "config.json").is_file():
            raise CheckFailed(f"no export at {self.run_dir / 'export'}", figures)
        return figures

    def start_beside(self) -> None:
        """The from-scratch arm and the token-count baseline, which need no pretrained weights."""
        self.processes["baseline"] = launch(
            [sys.executable, "launchers/token_baseline.py", "--config", "sst2",
             "--json", str(self.sst2 / "baseline.json"), *self.task_settings()], self.sst2 / "baseline", self.env)
        # the reference's checkpoint gives the architecture and tokenizer; its weights are not read
        self.processes["scratch"] = self.fine_tune(self.reference_dir, scratch=True)

    def task_settings(self) -> list[str]:
        sizes = self.sizes
        return set_args({"data.glue_dir": json.dumps(str(self.data / "glue")),
                         "data.max_train_examples": sizes.sst2_examples, "data.max_seq_len": sizes.sst2_seq_len})

    def fine_tune(self, model: Path, scratch: bool) -> subprocess.Popen:
        """The fine-tune command through the fair protocol: each setting of the grid scored on the held-out slice
        of train with the first seed, the chosen one trained over every seed and reported on dev."""
        out = self.sst2 / ("scratch" if scratch else "pretrained")
        settings = {"train.output_dir": out, "train.epochs": self.sizes.sst2_epochs, "train.batch_size": 32,
                    "tracking.enabled": "false", "train.precision": self.scale.precision}
        command = finetune_command("sst2", model, SST2_SEEDS, scratch=scratch, sweeps=[SST2_SWEEP], sets=settings)
        return launch([str(c) for c in command] + self.task_settings(), out, self.env)

    def transfer(self, seconds: float | None) -> dict[str, Any]:
        """The export's arm (the run's newest checkpoint where it was stopped), then both arms' and the baseline's
        dev accuracy; once `pretrain` has ended or stopped its run (`source`)."""
        ends = time.monotonic() + (600 if seconds is None else seconds)
        self.processes["pretrained"] = self.fine_tune(self.source, scratch=False)
        for name in ("baseline", "scratch", "pretrained"):
            finish(self.processes[name], self.sst2 / name, ends - time.monotonic())
        arms = {name: json.loads((self.sst2 / name / "metrics.json").read_text()) for name in ("pretrained", "scratch")}
        metric = arms["pretrained"]["metric"]
        baseline = json.loads((self.sst2 / "baseline.json").read_text())
        return {"task": "sst2", "metric": metric, "train_examples": self.sizes.sst2_examples, "seeds": SST2_SEEDS,
                "sweep": SST2_SWEEP,
                **{name: {"median": arm[metric], "mean": arm[f"{metric}_mean"], "std": arm[f"{metric}_std"],
                          "chosen": arm["chosen_setting"], "selection_score": arm["selection_score"]}
                   for name, arm in arms.items()},
                "difference": arms["pretrained"][metric] - arms["scratch"][metric],
                "token_baseline": baseline[metric]}

    def close(self) -> None:
        """Kill whatever is still running (a step that failed or ran out of time leaves no process behind)."""
        for process in self.processes.values():
            kill(process)


def signal_after(process: subprocess.Popen, run_dir: Path, after: int, timeout: float, sig: signal.Signals,
                 last_step: int | None = None) -> int:
    """Once the run has logged a step past `after`, the last step logged: SIGKILL it and its loader workers (once past
    its newest checkpoint too: the resume needs one, and steps to redo), or SIGTERM it, which checkpoints and exits
    (waited for); not where it has logged its `last_step`, past which the signal would only kill its exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = process.poll() is not None
        records = metrics(run_dir)
        logged = [r["step"] for r in records if "train/loss" in r]
        past = bool(logged) and logged[-1] > after
        checkpoints = [r["step"] for r in records if "checkpoint" in r]
        saved = sig != signal.SIGKILL or (bool(checkpoints) and past and logged[-1] > max(checkpoints))
        if ended and not (past and sig == signal.SIGTERM):
            raise RuntimeError(f"{run_dir.name} ended before step {after} (exit {process.returncode}): "
                               f"{last_words(run_dir)}")
        if saved and past:
            if sig == signal.SIGKILL:
                kill(process)
                return logged[-1]
            if not ended and logged[-1] != last_step:
                process.send_signal(sig)  # the rank: its loader workers ignore SIGTERM, and it stops them
            finish(process, run_dir, 120)
            return logged[-1]
        time.sleep(0.05)
    kill(process)
    raise TimeoutError(f"{run_dir.name} never logged step {after} within {timeout:.0f} s: {last_words(run_dir)}")


def wait_or_stop(process: subprocess.Popen, run_dir: Path, timeout: float) -> bool:
    """True when the run ends by itself within `timeout`; else it is sent SIGTERM (it checkpoints) and False."""
    try:
        process.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        finish(process, run_dir, 120)
        return False
    finish(process, run_dir, None)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description="The GPU check's loader-off run (gpu_check.py starts it).")
    p.add_argument("mode", choices=["in-memory"])
    p.add_argument("config", help="a pretrain config file")
    p.add_argument("--profile-from", type=int, default=None, help="profile the steps after this one")
    args = p.parse_args()
    run_in_memory(args.config, args.profile_from)


if __name__ == "__main__":
    main()
