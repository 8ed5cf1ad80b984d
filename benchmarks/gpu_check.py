"""Where the GPU path stands, in one command and one record: throughput, MFU, a run to the end that transfers, faults.

    python benchmarks/gpu_check.py --data DIR --budget-minutes 9 --started-at T0   # on a CUDA machine, in a lease
    python benchmarks/gpu_check.py --device cpu --tiny --data DIR   # the same code at toy size, so it cannot rot

Its parts run in order of value (PLAN), each within its cap; a failed step is recorded with its error and the check
goes on; the record is written after each part. docs/gpu-nodes.md describes each part and how a lease runs it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpu_runs import SHAPES, SST2_SEEDS, RunToTheEnd, Scale, find_data, plain_row, prepared_data, throughput_row
from harness import ROOT, BenchmarkRecord, Study, comma_list, peak_flops, toy_tokenizer

ARCHITECTURES = ("roberta", "roberta-prelayernorm", "bert", "modernbert")
# Relative loss difference allowed against fp32 after one step on the same batch. bf16 keeps 8 bits of
# mantissa (~0.4% per rounding), fp16 11 bits; a small model's loss sums few roundings. Measured on an H100: bf16
# 4.6e-5 and fp16 5e-6 at ZeRO 0 (autocast over fp32 masters), bf16 8.4e-4 at ZeRO 2 (DeepSpeed's own bf16).
TOLERANCE = {"bf16": 2e-3, "fp16": 5e-4}
MFU_TARGET, TOKENS_TARGET = 0.45, 350_000
"""The GPU targets on one H100 in bf16: RoBERTa-large's MFU (nominal peak), ModernBERT-base's packed real tokens/s."""
# Dense bf16/fp16 tensor-core peaks from NVIDIA's data sheets (TFLOP/s, without sparsity), by name fragment.
NOMINAL_TFLOPS = (("H200", 989.0), ("GH200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0),
                  ("A100", 312.0), ("L40S", 362.0), ("A10G", 70.0), ("L4", 121.0))
STUDY = Study(
    "gpu_check", question="Where does the GPU path stand?",
    metric="pass or fail per step; tokens/s and MFU; SST-2 dev accuracy after the run to the end (median of 3 seeds)",
    baseline=f"the plain PyTorch loop, fp32 and the padded path; targets: RoBERTa-large {MFU_TARGET:.0%} MFU as "
             f"trained (nominal peak) and ≥ 1.0× the plain loop, "
             f"ModernBERT-base {TOKENS_TARGET:,} tokens/s; the same model from scratch and token counts on SST-2",
    arms=(*ARCHITECTURES, "bf16", "fp16", "ZeRO 0", "ZeRO 2", "loader on", "loader off", "compiled", "plain loop",
          "export", "from scratch"))
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def small_model(architecture: str) -> dict[str, Any]:
    """SMALL as `architecture`'s model section: ModernBERT's window kept small, the others refuse the key."""
    return {**SMALL, "architecture": architecture, **({"local_attention": 16} if architecture == "modernbert" else {})}


class Steps:
    """Each step's outcome, in order: ok, failed (with the error) or skipped (with the reason). A step that would
    start past `budget_s` (from `started`, a `time.perf_counter()` value) or past its part's cap is skipped as out of
    time, so a lease ends with its record written; `seconds_left` is what the nearer of the two leaves."""

    def __init__(self, budget_s: float | None = None, started: float | None = None) -> None:
        self.outcomes: list[dict[str, Any]] = []
        self.started, self.budget_s = time.perf_counter() if started is None else started, budget_s
        self.part_cap_s: float | None = None
        self.part_ends: float | None = None  # perf_counter() when the current part's cap is spent

    def seconds_left(self) -> float | None:
        now = time.perf_counter()
        lefts = [x for x in (None if self.budget_s is None else self.budget_s - (now - self.started),
                             None if self.part_ends is None else self.part_ends - now) if x is not None]
        return min(lefts) if lefts else None

    @contextmanager
    def part(self, cap_s: float | None) -> Iterator[None]:
        """The steps inside start only within `cap_s` seconds of now (None: the budget alone bounds them)."""
        self.part_cap_s, self.part_ends = cap_s, None if cap_s is None else time.perf_counter() + cap_s
        try:
            yield
        finally:
            self.part_cap_s = self.part_ends = None

    def attempt(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Run `fn`; record what it returned, or its failure, and never raise (Ctrl-C aside)."""
        start = time.perf_counter()
        try:
            left = self.seconds_left()
            if left is not None and left < MIN_STEP_SECONDS:
                raise Skipped("out of time: " + (f"the part's cap of {self.part_cap_s:g} s was spent"
                                                 if self.part_ends is not None and self.part_ends <= start else
                                                 f"the check's budget of {self.budget_s / 60:g} min was spent"))
            found = fn() or {}
        except Skipped as why:
            self.outcomes.append({"step": name, "status": "skipped", "reason": str(why)})
            return None
        except Exception as exc:  # noqa: BLE001 (the check's point: record every failure and go on)
            self.outcomes.append({"step": name, "status": "failed", **getattr(exc, "figures", {}),
                                  "error": f"{type(exc).__name__}: {exc}"[:2000],
                                  "traceback": traceback.format_exc()[-4000:],
                                  "seconds": round(time.perf_counter() - start, 2)})
            print(f"  {name}: FAILED ({_note(self.outcomes[-1])})", flush=True)
            return None
        self.outcomes.append({"step": name, "status": "ok", "seconds": round(time.perf_counter() - start, 2), **found})
        return found


class Skipped(Exception):
    """A step that cannot run here, with the reason."""


MIN_STEP_SECONDS = 15  # a step with less left is skipped: a run started then is killed before its first logged step
NO_SHARDS = "no shards (the data step failed)"


def nominal_tflops(gpu_name: str | None) -> float | None:
    """The data sheet's dense bf16 peak of this GPU, None where it is not in the table (or on CPU)."""
    return next((tflops for fragment, tflops in NOMINAL_TFLOPS if fragment in gpu_name), None) if gpu_name else None


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def pinned_versions() -> dict[str, str]:
    """name → version of the packages the wheelhouse pins (`pin` rows of launchers/wheelhouse-packages.txt): the
    versions the CPU tests run with, which a GPU node gets over its image's own."""
    pins = {}
    for line in (ROOT / "launchers" / "wheelhouse-packages.txt").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 3 and fields[1] == "pin":
            pins[fields[0]] = fields[2]
    return pins


def versions() -> dict[str, Any]:
    """The pinned packages' versions here against the pins; a mismatch fails this step (the run goes on, flagged):
    tests that passed on CPU may differ under another transformers or tokenizers."""
    found = {name: {"installed": installed_version(name), "pinned": pin} for name, pin in pinned_versions().items()}
    wrong = [f"{name} {v['installed']} (pinned {v['pinned']})" for name, v in found.items()
             if v["installed"] != v["pinned"]]
    if wrong:
        raise AssertionError(f"not the CPU tests' versions: {', '.join(wrong)}; install the wheelhouse "
                             "(launchers/wheelhouse.sh install), which puts the pinned ones over the image's")
    return found


def environment(device: str, tiny: bool) -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                             **{p: installed_version(p) for p in ("deepspeed", "transformers", "tokenizers",
                                                                   "flash-attn", "triton")}}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        found.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}")
    dtypes = ("bf16", "fp16") if device == "cuda" else ("bf16", "fp32")
    n, repeats = (256, 3) if tiny else ((8192, 20) if device == "cuda" else (2048, 3))
    found["peak_tflops"] = {d: round(peak_flops(n=n, repeats=repeats, dtype=d, device=device) / 1e12, 4)
                            for d in dtypes}
    found["matmul"] = f"{n}² torch.mm, best of {repeats}"
    found["nominal_tflops"] = nominal_tflops(found.get("gpu"))
    return found


# ---------------------------------------------------------------- correctness: one DeepSpeed step per cell

def fixed_batch(device: str, vocab: int, rows: int = 4, seq_len: int = 32) -> dict[str, Any]:
    """One padded, 15%-masked batch of Zipf-distributed tokens, the same for every cell."""
    import torch

    from pipeline.pretrain.batches.masked_slots import masked_slots

    g = torch.Generator().manual_seed(0)
    zipf = 1.0 / torch.arange(1, vocab - 4, dtype=torch.float64)
    ids = 5 + torch.multinomial(zipf, rows * seq_len, replacement=True, generator=g).reshape(rows, seq_len)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (rows,), generator=g)
    attention = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    ids[attention == 0] = 1
    chosen = (torch.rand(ids.shape, generator=g) < 0.15) & (attention == 1)
    chosen[:, 1] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    batch = {"input_ids": torch.where(chosen, torch.full_like(ids, 4), ids), **masked_slots(labels),
             "attention_mask": attention}
    return {k: v.to(device) for k, v in batch.items()}


def one_step(architecture: str, precision: str, stage: int, device: str) -> tuple[float, float]:
    """(loss before, loss on the same batch after one optimizer step) of the pipeline's engine."""
    import torch

    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain import config as c
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine

    # fp16 starts at a low loss scale: a first step skipped for overflow would compare nothing
    ds = {"fp16": {"initial_scale_power": 8}} if precision == "fp16" else {}
    model_keys = {**small_model(architecture), **({"next_sentence_loss": False} if architecture == "bert" else {})}
    config = c.PretrainConfig(model=ModelConfig(**model_keys), data=c.DataConfig(shards="unused", tokenizer="unused"),
                              optimizer=c.OptimizerConfig(lr=1e-3),
                              schedule=c.ScheduleConfig(warmup_steps=0, decay="constant"),
                              train=c.TrainConfig(max_steps=1, global_batch_size=4, micro_batch_size=4,
                                                  precision=precision, zero_stage=stage),
                              deepspeed=ds)
    phases, tokenizer = resolve_phases(config), toy_tokenizer(300)
    torch.manual_seed(0)
    engine = initialize_engine(build_model(config.model, tokenizer, 32), config, phases[0].plan(1),
                               schedule=lr_schedule(config, phases), guard=SpikeGuard(config, device, 1))
    engine.train()
    batch = fixed_batch(device, tokenizer.vocab_size)
    loss = engine(**batch)["loss"]
    engine.backward(loss)
    engine.step()
    with torch.no_grad():
        return loss.item(), engine(**batch)["loss"].item()


def correctness(steps: Steps, device: str) -> list[dict[str, Any]]:
    rows = []
    for architecture in ARCHITECTURES:
        reference = steps.attempt(f"correctness/{architecture}/fp32",
                                  lambda a=architecture: dict(zip(("loss", "loss_after"),
                                                                  one_step(a, "fp32", 0, device), strict=True)))
        for precision in ("bf16", "fp16"):
            for stage in (0, 2):
                def cell(a=architecture, p=precision, s=stage, reference=reference):
                    if p == "fp16" and device != "cuda":
                        raise Skipped("fp16: DeepSpeed does not support it on CPU (\"Type fp16 is not supported\")")
                    if reference is None:
                        raise Skipped("the fp32 reference failed")
                    before, after = one_step(a, p, s, device)
                    first = abs(before - reference["loss"]) / reference["loss"]
                    second = abs(after - reference["loss_after"]) / reference["loss_after"]
                    worst = max(first, second)
                    if not worst <= TOLERANCE[p]:
                        raise AssertionError(f"loss {before:.5f} → {after:.5f} vs fp32 {reference['loss']:.5f} → "
                                             f"{reference['loss_after']:.5f}: relative {worst:.2e} > {TOLERANCE[p]}")
                    return {"loss": before, "loss_after": after, "relative_before": first,
                            "relative_after": second, "relative_difference": worst,
                            "tolerance": TOLERANCE[p]}
                steps.attempt(f"correctness/{architecture}/{precision}/zero{stage}", cell)
                rows.append(_row(steps.outcomes[-1], "relative loss difference", "relative_difference",
                                 architecture=architecture, precision=precision, zero=stage))
    return rows


def _note(outcome: dict[str, Any]) -> str:
    """A failure's or skip's last words on one line: the last `SomeError: ...` line of a run's stderr (warnings
    printed after it at exit are not the cause), else the end of the text."""
    raw = outcome.get("error") or outcome.get("reason") or ""
    raised = re.findall(r"\b(\w+(?:Error|Exception): .*)", raw)
    text = " ".join((raised[-1] if raised and "\n" in raw else raw).split())
    return text if len(text) <= 160 else "…" + text[-159:]


def _row(outcome: dict[str, Any], column: str, figure: str, **keys: Any) -> dict[str, Any]:
    """A table row from a step's outcome: its keys, status, and its `figure` (under `column`) or the reason."""
    value = outcome.get(figure)
    return {**keys, "status": outcome["status"], column: None if value is None else f"{value:.1e}",
            "note": _note(outcome)}


# ---------------------------------------------------------------- packed documents against the padded path

def packed_paths(device: str) -> list[str]:
    flash = device == "cuda" and installed_version("flash-attn") is not None
    return ["sdpa", "eager", "flex_attention", *(["flash_attention_2"] if flash else [])]


def packed_difference(architecture: str, attention: str, device: str) -> dict[str, Any]:
    """Largest |packed − alone| over every document of some doc-packed rows; alone = the padded (sdpa) path."""
    import copy

    import numpy as np
    import torch

    from pipeline.data.packers import make_packer
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import SPARSE_CLASSES, encode, first_position_id, hf_config
    from pipeline.models.architectures.packed_attention import document_layout

    info, seq_len = toy_tokenizer(300), 64
    keys = {**small_model(architecture), "num_hidden_layers": 3, "attn_implementation": attention}
    config = hf_config(ModelConfig(**keys), info, seq_len)
    padded_config = copy.deepcopy(config)
    padded_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = SPARSE_CLASSES[architecture](config).eval().to(device)
    padded = SPARSE_CLASSES[architecture](padded_config).eval().to(device)
    padded.load_state_dict(model.state_dict())
    if attention == "flash_attention_2":  # FlashAttention runs in half precision only
        model, padded = model.to(torch.bfloat16), padded.to(torch.bfloat16)
    rng = np.random.default_rng(3)
    docs = [rng.integers(10, info.vocab_size, size=int(rng.integers(1, 40))) for _ in range(12)]
    packer = make_packer("doc-packed", seq_len, info.cls_id, info.sep_id, info.pad_id, np.uint16)
    out, rest = packer.add(np.concatenate(docs), np.array([len(d) for d in docs])), packer.finish()
    rows = {k: np.concatenate([out[k], rest[k]]) for k in out}
    offset = first_position_id(architecture, info.pad_id)
    document_ids, position_ids = document_layout(rows["doc_starts"], rows["length"].astype(np.int64), seq_len, offset)
    ids = torch.from_numpy(rows["input_ids"].astype(np.int64)).to(device)
    pick = {"roberta": "roberta", "roberta-prelayernorm": "roberta_prelayernorm", "bert": "bert",
            "modernbert": "model"}[architecture]
    worst, compared = 0.0, 0
    with torch.no_grad():
        packed = encode(getattr(model, pick), ids, document_ids=torch.from_numpy(document_ids).to(device),
                        position_ids=torch.from_numpy(position_ids).to(device)).last_hidden_state
        for r, (starts, length) in enumerate(zip(rows["doc_starts"], rows["length"], strict=True)):
            bounds = [s for s in starts.tolist() if s >= 0] + [int(length)]
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                alone = encode(getattr(padded, pick), ids[r: r + 1, a:b]).last_hidden_state[0]
                worst = max(worst, (alone.float() - packed[r, a:b].float()).abs().max().item())
                compared += 1
    tolerance = 5e-2 if attention == "flash_attention_2" else 1e-4
    if not worst <= tolerance:
        raise AssertionError(f"packed differs from alone by {worst:.2e} (> {tolerance}) over {compared} documents")
    return {"max_abs_difference": worst, "documents": compared, "tolerance": tolerance}


def packed(steps: Steps, device: str) -> list[dict[str, Any]]:
    rows = []
    for architecture in ARCHITECTURES:
        for attention in packed_paths(device):
            steps.attempt(f"packed/{architecture}/{attention}",
                          lambda a=architecture, t=attention: packed_difference(a, t, device))
            rows.append(_row(steps.outcomes[-1], "max |packed − alone|", "max_abs_difference",
                             architecture=architecture, attention=attention))
    return rows


def _percent(x: float | None) -> str | None:
    return None if x is None else f"{x:.1%}"


# ---------------------------------------------------------------- the pretraining runs (gpu_runs.py)

def throughput(steps: Steps, work: Path, scale: Scale, made: dict[str, Any] | None, peaks: dict[str, Any] | None,
               cells: list[tuple[str, str, bool, bool]]) -> list[dict[str, Any]]:
    """A row per cell (model, arm, compiled, loader): `ours` is the pretrain command (loader off: micro batches
    replayed on the device, and a profile), `plain` the plain PyTorch loop (plain_loop.py)."""
    rows = []
    for name, arm, compiled, loader in cells:
        def cell(name=name, arm=arm, compiled=compiled, loader=loader):
            if made is None:
                raise Skipped(NO_SHARDS)
            cap = 300 if scale.tiny or compiled else 90  # one stuck run must not take the lease
            timeout = cap if (left := steps.seconds_left()) is None else min(cap, left)
            if arm == "plain":
                return plain_row(work, made, scale, name, compiled, peaks, timeout)
            return throughput_row(work, made, scale, name, compiled, loader, peaks, timeout)
        kind = "compile" if compiled else "eager"
        steps.attempt(f"throughput/{name}/{arm}/{kind}/{'loader' if loader else 'in-memory'}", cell)
        o = steps.outcomes[-1]
        profile = o.get("profile") or {}
        top = (profile.get("top") or [{}])[0]
        rows.append({"run": f"{name}{' (tiny)' if scale.tiny else ''}, seq {o.get('seq_len', '–')} × "
                            f"{o.get('micro_batch', '–')}",
                     "step": {"ours": "the pretrain command", "plain": "plain PyTorch loop"}[arm],
                     "compiled": compiled, "batches": "loader" if loader else "in memory", "status": o["status"],
                     "real tokens/s": f"{o['real_tokens_per_s']:,.0f}" if "real_tokens_per_s" in o else None,
                     "MFU as trained": _percent(o.get("mfu_nominal_peak")),
                     "MFU, full head": _percent(o.get("mfu_full_head_nominal_peak")),
                     "GPU idle": _percent(profile.get("gpu_idle_share")),
                     "syncs / step": profile.get("syncs_per_step"),
                     "top kernel": f"{top['name'][:40]} ({top['share']:.0%})" if top else None,
                     "note": _note(o)})
    return rows


def run_to_the_end(steps: Steps, work: Path, scale: Scale, made: dict[str, Any] | None,
                   data: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two steps, the pretraining (killed -9, resumed, compared, exported), then the transfer to SST-2; a row each."""
    e2e = None if made is None else RunToTheEnd(work, made, scale, data)

    def pretrain() -> dict[str, Any]:
        if e2e is None:
            raise Skipped(NO_SHARDS)
        return e2e.pretrain(steps.seconds_left())

    def transfer() -> dict[str, Any]:
        if e2e is None or e2e.source is None:
            raise Skipped("no pretrained model: the pretraining step failed before its run ended")
        return e2e.transfer(steps.seconds_left())

    try:
        steps.attempt("e2e/pretrain-kill-resume-export", pretrain)
        pretrained = steps.outcomes[-1]
        steps.attempt("e2e/transfer-sst2", transfer)
        transferred = steps.outcomes[-1]
    finally:
        if e2e is not None:
            e2e.close()
    o, sizes = pretrained, scale.run
    evals = o.get("eval_mlm_loss") or {}
    run = {"run": f"ModernBERT-small{' (tiny)' if scale.tiny else ''} on {'IMDB' if data else 'no data'}, "
                  f"{sizes.steps:,} steps × {sizes.batch} × {scale.seq_len(True):,}",
           "status": o["status"], "steps done": o.get("steps_done"), "killed at step": o.get("killed_at_step"),
           "resumed at step": o.get("resumed_at_step"),
           "max |Δ loss|, redone steps": _difference(o, "max_abs_redone_loss_difference", "redone_steps"),
           "max |Δ loss|, uninterrupted run": _difference(o, "max_abs_loss_difference", "compared_steps"),
           "identical losses": o.get("identical_losses"),
           "loss": f"{o['first_loss']:.2f} → {o['final_loss']:.2f}" if "final_loss" in o else None,
           "validation MLM loss": f"{list(evals.values())[-1]:.2f}" if evals else None,
           "minutes": f"{o['pretrain_seconds'] / 60:.1f}" if "pretrain_seconds" in o else None,
           "export": o.get("export"), "note": _note(o)}
    t = transferred
    arms = ("pretrained", "scratch")
    transfer = {"task": f"SST-2, {sizes.sst2_examples:,} training sentences, seeds {SST2_SEEDS}",
                "status": t["status"],
                **({"pretrained (median)": f"{t['pretrained']['median']:.3f}",
                    "from scratch (median)": f"{t['scratch']['median']:.3f}",
                    "difference": f"{100 * t['difference']:+.1f} points",
                    "token-count baseline": f"{t['token_baseline']:.3f}",
                    "chosen (pretrained / scratch)": " / ".join(",".join(f"{k}={v}" for k, v in t[a]["chosen"].items())
                                                                for a in arms),
                    "held-out slice (pretrained / scratch)": " / ".join(f"{t[a]['selection_score']:.3f}"
                                                                        for a in arms)}
                   if "difference" in t else {}), "note": _note(t)}
    return [run], [transfer]


def _difference(outcome: dict[str, Any], key: str, count: str) -> str | None:
    return None if outcome.get(key) is None else f"{outcome[key]:.1e} ({outcome[count]} steps)"


# ---------------------------------------------------------------- the check

def headlines(rec: BenchmarkRecord, steps: Steps, device: str, tiny: bool) -> None:
    """The two GPU targets and the transfer; recorded only for a full-size CUDA run."""
    if device != "cuda" or tiny:
        return
    found = {o["step"]: o for o in steps.outcomes}

    def best(name: str, key: str, arm: str = "ours") -> float | None:
        figures = [o[key] for step, o in found.items() if step.startswith(f"throughput/{name}/{arm}/") and key in o]
        return max(figures) if figures else None

    large = best("RoBERTa-large", "mfu_nominal_peak")
    rec.headline("RoBERTa-large seq 512 bf16, MFU as trained (nominal peak)", None if large is None else f"{large:.1%}",
                 target=f"≥ {MFU_TARGET:.0%}", met=None if large is None else large >= MFU_TARGET)
    ours, plain = best("RoBERTa-large", "real_tokens_per_s"), best("RoBERTa-large", "real_tokens_per_s", "plain")
    rec.headline("RoBERTa-large tokens/s, the pretrain command ÷ the plain PyTorch loop",
                 None if not (ours and plain) else f"{ours / plain:.2f}× ({ours:,.0f} vs {plain:,.0f})",
                 target="≥ 1.0×", met=None if not (ours and plain) else ours >= plain)
    rate = best("ModernBERT-base", "real_tokens_per_s")
    rec.headline("ModernBERT-base seq 1024 packed bf16, real tokens/s", None if rate is None else f"{rate:,.0f}",
                 target=f"≥ {TOKENS_TARGET:,}", met=None if rate is None else rate >= TOKENS_TARGET)
    t = found.get("e2e/transfer-sst2", {})
    if "difference" in t:
        rec.headline("SST-2 dev accuracy, the run to the end's export − from scratch (medians)",
                     f"{100 * t['difference']:+.1f} points ({t['pretrained']['median']:.3f} vs "
                     f"{t['scratch']['median']:.3f}; token counts {t['token_baseline']:.3f})")


TARGET_MODELS = ("RoBERTa-large", "ModernBERT-base")
"""The throughput models that have a target: measured first, the others last."""
# The order of value: a lease stopped early keeps the targets against the plain loop, then the transfer row. Each
# entry: the part (`--skip` names it) and its cap in seconds on a full-size run (None: only the budget bounds it);
# docs/gpu-nodes.md splits a lease's minutes by these.
PLAN = (("targets", 330), ("e2e", 400), ("correctness", 45), ("eager", 200), ("packed", 45), ("others", None))
PARTS = tuple(part for part, _ in PLAN)
"""The parts `--skip` names."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="toy sizes (the test suite's run); the same code")
    p.add_argument("--skip", default="", help=f"comma-separated parts to leave out, of {', '.join(PARTS)}")
    p.add_argument("--models", default=",".join(SHAPES),
                   help=f"throughput models, comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--data", default=None,
                   help="a folder laid out as /work/shared/data (corpus/imdb-reviews.jsonl.zst, glue/SST-2); "
                        "default: shared/data in the checkout, else ../shared/data beside it")
    p.add_argument("--work-dir", default=None, help="the tokenizer, shards and runs, reused by a rerun (default: a "
                   "temporary folder)")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="skip the steps that would start later than this (a lent machine's lease)")
    p.add_argument("--started-at", type=float, default=None, metavar="UNIX_TIME",
                   help="count --budget-minutes from this time (`date +%%s` when the lease's command started)")
    a = p.parse_args(argv)
    a.models = tuple(comma_list(p, "--models", a.models, SHAPES, empty=True))
    skipped = set(comma_list(p, "--skip", a.skip, PARTS, empty=True))
    if a.budget_minutes is not None and a.budget_minutes <= 0:
        p.error(f"--budget-minutes {a.budget_minutes:g}: give a positive number of minutes")
    if a.started_at is not None and not 0 <= time.time() - a.started_at < 86_400:
        p.error(f"--started-at {a.started_at:g}: not within the last day (give `date +%s` of the command's start)")
    a.data = find_data(a.data)
    variant = f"{a.device}-tiny" if a.tiny else (None if a.device == "cuda" else a.device)
    with STUDY.record(variant, sys.argv if argv is None else [__file__, *argv]) as rec:
        run_check(a, skipped, rec)


def run_check(a: argparse.Namespace, skipped: set[str], rec: BenchmarkRecord) -> Steps:
    """Every part in order of value (PLAN), the record written after each: what a lease must show first comes first."""
    if a.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from pipeline.common.processes.topology import prepare_environment

    scale = Scale(a.device, a.tiny)
    since = None if a.started_at is None else time.perf_counter() - (time.time() - a.started_at)
    steps = Steps(None if a.budget_minutes is None else 60 * a.budget_minutes, since)
    steps.attempt("environment/process group", lambda: _process_group(prepare_environment()))
    env = steps.attempt("environment", lambda: environment(a.device, a.tiny))
    rec.results["environment"] = env or {}
    rec.results["versions"] = steps.attempt("environment/versions", versions) or {
        n: {"installed": installed_version(n), "pinned": v} for n, v in pinned_versions().items()}
    rec.results["data"] = str(a.data) if a.data else None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(a.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        made = None
        if {"targets", "e2e", "eager", "others"} - skipped:
            made = steps.attempt("data", lambda: prepared_data(work, scale, a.data))
        targets = tuple(m for m in a.models if m in TARGET_MODELS)
        others = tuple(m for m in a.models if m not in TARGET_MODELS)

        def measure(models: tuple[str, ...], compiled: bool, loader: bool) -> list[dict[str, Any]]:
            """Per model: ours with the loader (if `loader`), ours in memory, the plain loop."""
            cells = [(m, "ours", compiled, True) for m in models if loader]
            cells += [(m, arm, compiled, False) for m in models for arm in ("ours", "plain")]
            return throughput(steps, work, scale, made, env, sorted(cells, key=lambda c: models.index(c[0])))

        against = "the pretrain command (micro batches replayed on the device) against the plain PyTorch loop"
        parts = {
            "targets": lambda: [(f"throughput, train.compile, the targets' models: {against}",
                                 measure(targets, compiled=True, loader=False))],
            "e2e": lambda: list(zip(("the run to the end: IMDB shards, pretraining killed -9 and resumed, export",
                                     "transfer: SST-2 dev accuracy through the fair protocol, from the export and "
                                     "from scratch"), run_to_the_end(steps, work, scale, made, a.data), strict=True)),
            "correctness": lambda: [("correctness: one DeepSpeed step vs fp32, same batch (relative loss difference)",
                                     correctness(steps, a.device))],
            "eager": lambda: [("throughput, eager, the targets' models: the pretrain command with its loader and "
                               "without, and the plain loop", measure(targets, compiled=False, loader=True))],
            "packed": lambda: [("packed documents: each attention path vs the padded path, per document",
                                packed(steps, a.device))],
            "others": lambda: [(f"throughput, train.compile, the other models: {against}",
                                measure(others, compiled=True, loader=False))],
        }
        for part, cap in PLAN:
            if part in skipped:
                continue
            with steps.part(None if a.tiny else cap):
                tables = parts[part]()
            for title, rows in tables:
                if rows:
                    rec.table(title, rows)
            summarise(rec, steps, a)
            rec.write()  # what finished so far survives a check stopped from outside
    summarise(rec, steps, a)
    counts = rec.results["summary"]
    print(f"\nenvironment: {env}\nversions: {rec.results['versions']}\n{counts['ok']} ok, {counts['failed']} "
          f"failed, {counts['skipped']} skipped in {counts['seconds']:.0f} s")
    return steps


def summarise(rec: BenchmarkRecord, steps: Steps, a: argparse.Namespace) -> None:
    """The record's steps, counts and headlines as they stand now."""
    rec.results["steps"] = steps.outcomes
    counts = {s: sum(o["status"] == s for o in steps.outcomes) for s in ("ok", "failed", "skipped")}
    rec.results["summary"] = {**counts, "seconds": round(time.perf_counter() - steps.started, 1)}
    headlines(rec, steps, a.device, a.tiny)


def _process_group(topology) -> dict[str, Any]:
    """One process group for the in-process DeepSpeed engines (as the trainer starts it)."""
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if topology.cuda else "gloo")
    return {"world_size": topology.world_size, "cuda": topology.cuda}


if __name__ == "__main__":
    main()
