"""Between logging steps a training step reads nothing back from the device, on every precision, ZeRO stage,
architecture and shipped optimizer.

A read makes the host wait until the device has run everything queued, so it cannot queue the next kernels
meanwhile. Each case trains a 2-layer model through `Pretrainer.train`, and over its steps after the first two
(which build the optimizer's states) counts what reads: the operator calls `aten._local_scalar_dense` (`.item()`,
`float()`, `bool()` of a tensor), `aten.nonzero` and `aten.is_nonzero`, calls to `torch.cuda.synchronize` and the
DeepSpeed accelerator's `synchronize`, and indexing by a boolean mask (on CUDA it finds the mask's nonzero
entries, a read; on CPU that happens below the dispatcher, so the boolean index is what is seen). The model's
reads are counted apart from the engine's: those inside its forward, and boolean indexing anywhere (the masked
head's gather and, in the backward, its scatter). On CPU a device→host copy (`.cpu()`, `.tolist()`) is no
operator call and is not seen.

Host→device copies are counted too, as `host_to_device`: on a GPU a tensor made from host values
(`torch.tensor([...], device=...)`, `torch.as_tensor(x)`: the operator `aten.lift_fresh`, seen on CPU as well) is a
copy from pageable memory that blocks the host like a read, and so is a blocking copy of a host tensor to the device
(`_to_copy` or `copy_` from the CPU, seen where there is a device). The batch's own copy (`non_blocking`, from pinned
memory) does not block and is not counted.

fp16 runs here at ZeRO 0 only (autocast and torch's GradScaler work on CPU; DeepSpeed's own fp16, which ZeRO 1-3
use, does not). With the spike guard on (spike_guard.py), the same holds: it judges every step on the device, and
with `skip` a planted spike's update is left out inside the counted steps.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import ROOT, tiny_pretrain_config
from torch.utils._python_dispatch import TorchDispatchMode

READS = {"_local_scalar_dense", "nonzero", "is_nonzero"}
HOST_TO_DEVICE = "host_to_device"
WARM_STEPS, COUNTED_STEPS = 2, 3
SPIKE_AT = WARM_STEPS + 2
"""The counted step whose gradients the drill multiplies, with `train.spike_guard skip`."""
ARCHITECTURES = ("roberta", "roberta-prelayernorm", "bert", "modernbert")
STEP_READS = {
    # DeepSpeed 0.19.8 `stage_1_and_2.py` step(): `is_invalid_grad_norm` on an fp32 norm, to skip a non-finite step.
    ("fp32", 1): "DeepSpeed's ZeRO 1/2 step asks the host whether an fp32 gradient norm is finite",
    ("fp32", 2): "DeepSpeed's ZeRO 1/2 step asks the host whether an fp32 gradient norm is finite",
    # `stage3.py` step(): the same check at every precision; ZeRO 3 is no shipped config's.
    ("fp32", 3): "DeepSpeed's ZeRO 3 step asks the host whether the gradient norm is finite",
    ("bf16", 3): "DeepSpeed's ZeRO 3 step asks the host whether the gradient norm is finite",
}
DEEPSPEED_NORM_COPY = ("DeepSpeed's ZeRO 1-3 gradient norm (`mask_nan_or_inf_with_val_inplace`) makes "
                       "`torch.tensor(-1.0, device=...)` for each parameter group, every step")
STEP_COPIES = {(precision, stage): DEEPSPEED_NORM_COPY for precision in ("fp32", "bf16") for stage in (1, 2, 3)}
"""DeepSpeed 0.19.8's own host-to-device copies (`stage_1_and_2.py` `get_grad_norm_direct`, `stage3.py`
`get_grad_norm_direct`); the LAMB and StableAdamW recipes run at ZeRO 0, which has none."""


class DeviceReads(TorchDispatchMode):
    """Counts reads (see the module docstring) while `counting`, as `("model" | "engine", what)`."""

    def __init__(self):
        super().__init__()
        self.found: Counter[tuple[str, str]] = Counter()
        self.counting = self.in_forward = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        shape_read = name == "masked_select" or (name.startswith("index") and boolean_index(args[1:2]))
        if self.counting and (name in READS or shape_read):
            self.found["model" if self.in_forward or shape_read else "engine", name] += 1
        if self.counting and copies_to_device(name, args, kwargs or {}):
            self.found["model" if self.in_forward else "engine", HOST_TO_DEVICE] += 1
        return func(*args, **(kwargs or {}))

    def synchronized(self, *args, **kwargs) -> None:
        if self.counting:
            self.found["engine", "synchronize"] += 1

    def at(self, place: str) -> dict[str, int]:
        return {what: n for (where, what), n in self.found.items() if where == place}


def copies_to_device(name: str, args, kwargs: dict) -> bool:
    """Whether an operator call copies host values to the device, blocking (see the module docstring)."""
    if name in ("lift_fresh", "lift_fresh_copy"):
        return True
    if name not in ("_to_copy", "copy_") or kwargs.get("non_blocking") or (len(args) > 2 and args[2] is True):
        return False
    source = args[1] if name == "copy_" else args[0]
    target = args[0].device if name == "copy_" else kwargs.get("device") or source.device
    return isinstance(source, torch.Tensor) and source.device.type == "cpu" and torch.device(target).type != "cpu"


def boolean_index(args) -> bool:
    """Whether an indexing operator's index list (its second argument) holds a boolean mask."""
    indices = args[0] if args and isinstance(args[0], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def train_counting(folder: Path, shards: Path, tokenizer: Path, architecture: str, precision: str, stage: int,
                   monkeypatch, guard: str = "off", optimizer: str = "adamw", clipping: float = 1.0,
                   contrastive: bool = False) -> DeviceReads:
    """Train a 2-layer model for WARM_STEPS + COUNTED_STEPS steps (logging only at the end) through
    `Pretrainer.train`, counting reads in the last COUNTED_STEPS calls of its `train_step`; with the spike `guard`
    judging from the third step (and, with `skip`, a spike planted at SPIKE_AT); `contrastive` adds the span loss
    (BERT then trains without next-sentence prediction)."""
    from deepspeed.accelerator import get_accelerator

    import pipeline.pretrain.trainer as trainer_module
    from pipeline.common.processes.topology import current_topology
    from pipeline.pretrain.preflight import prepare_run

    model = {"architecture": architecture, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
             **({"next_sentence_loss": False} if contrastive and architecture == "bert" else {})}
    guarded = {"spike_guard": guard, **({"inject_spike": f"{SPIKE_AT}:1e4"} if guard == "skip" else {})}
    # fp16's first loss scale of 2^16 would turn the planted spike into an overflow, which is its scaler's to skip.
    scale = {"deepspeed": {"fp16": {"initial_scale_power": 0}}} if precision == "fp16" and guard == "skip" else {}
    data = tiny_pretrain_config(shards, tokenizer, folder, model=model, guard={"window": 4, "min_steps": 2}, **scale,
                                optimizer={"name": optimizer}, contrastive={"weight": 1.0 if contrastive else 0.0},
                                train={"precision": precision, "zero_stage": stage, "log_every": 100,
                                       "gradient_clipping": clipping,
                                       "max_steps": WARM_STEPS + COUNTED_STEPS, "export": False, "eval_sequences": 8,
                                       **guarded},
                                checkpoint={"every": 100})
    path = folder.with_suffix(".json")
    path.write_text(json.dumps(data))
    # The preflight refuses fp16 without a GPU, because DeepSpeed's own fp16 (ZeRO 1-3) has no CPU build.
    plan = prepare_run(path, world_size=1, cuda=precision == "fp16")
    reads = DeviceReads()
    monkeypatch.setattr(get_accelerator(), "synchronize", reads.synchronized)
    monkeypatch.setattr(torch.cuda, "synchronize", reads.synchronized)
    # The host batch, as the loader delivers it, before its copy to the device: no device read on a GPU.
    real_tokens = trainer_module.real_tokens
    monkeypatch.setattr(trainer_module, "real_tokens", lambda batch: paused(reads, real_tokens, batch))
    trainer = trainer_module.Pretrainer(plan, current_topology())
    module = trainer.engine.module
    module.register_forward_pre_hook(lambda *_: setattr(reads, "in_forward", True))
    module.register_forward_hook(lambda *_: setattr(reads, "in_forward", False))
    steps, train_step = itertools.count(), trainer.train_step

    def counted_step(batches):
        reads.counting = next(steps) >= WARM_STEPS
        try:
            return train_step(HostBatches(reads, batches))
        finally:
            reads.counting = False

    trainer.train_step = counted_step
    with reads:
        trainer.train()
    assert next(steps) == WARM_STEPS + COUNTED_STEPS
    return reads


class HostBatches:
    """The loader's batches, made on the host (in this process when it has no workers): not counted."""

    def __init__(self, reads: DeviceReads, batches):
        self.reads, self.batches = reads, batches

    def __next__(self):
        return paused(self.reads, next, self.batches)


def paused(reads: DeviceReads, function, *args):
    counting, reads.counting = reads.counting, False
    try:
        return function(*args)
    finally:
        reads.counting = counting


@pytest.fixture(scope="module")
def counted(tmp_path_factory, process_group, roberta_shards, bpe_tokenizer_dir, pairs_shards,
            wordpiece_tokenizer_dir, doc_packed_shards):
    """Each case's reads, counted once (the engine test and the head test read the same runs). With `contrastive`,
    ModernBERT trains on doc-packed rows and BERT on full ones (its pairs hold no single document)."""
    cache: dict[tuple, DeviceReads] = {}

    def count(architecture: str, precision: str, stage: int, guard: str = "off",
              optimizer: str = "adamw", clipping: float = 1.0, contrastive: bool = False) -> DeviceReads:
        key = architecture, precision, stage, guard, optimizer, clipping, contrastive
        if key not in cache:
            shards, tokenizer = ((pairs_shards, wordpiece_tokenizer_dir) if architecture == "bert" and not contrastive
                                 else (roberta_shards, bpe_tokenizer_dir))
            if contrastive and architecture == "modernbert":
                shards = doc_packed_shards
            with pytest.MonkeyPatch.context() as monkeypatch:
                folder = tmp_path_factory.mktemp("run") / "out"
                cache[key] = train_counting(folder, shards, tokenizer, *key[:3], monkeypatch, guard, optimizer,
                                            clipping, contrastive)
                cache[key].folder = folder
        return cache[key]

    return count


def cases(expected: dict[tuple[str, int], str]) -> list:
    """Every architecture at fp32 and bf16 on ZeRO 0-3 and fp16 on ZeRO 0; DeepSpeed's own (`expected`) fail."""
    settings = [*itertools.product(("fp32", "bf16"), (0, 1, 2, 3)), ("fp16", 0)]
    return [pytest.param(architecture, precision, stage, id=f"{architecture}-{precision}-zero{stage}",
                         marks=[pytest.mark.xfail(strict=True, reason=expected[precision, stage])]
                         if (precision, stage) in expected else [])
            for architecture in ARCHITECTURES for precision, stage in settings]


@pytest.mark.parametrize(("architecture", "precision", "stage"), cases(STEP_READS))
def test_the_engines_step_reads_nothing_back_between_logging_steps(counted, architecture, precision, stage):
    engine = {what: n for what, n in counted(architecture, precision, stage).at("engine").items()
              if what != HOST_TO_DEVICE}
    assert not engine, f"{architecture} {precision} ZeRO {stage}: {engine} over {COUNTED_STEPS} steps"


@pytest.mark.parametrize(("architecture", "precision", "stage"), cases(STEP_COPIES))
def test_the_engines_step_copies_nothing_to_the_device_between_logging_steps(counted, architecture, precision,
                                                                            stage):
    copies = counted(architecture, precision, stage).at("engine").get(HOST_TO_DEVICE, 0)
    assert not copies, f"{architecture} {precision} ZeRO {stage}: {copies} host-to-device copies over " \
                       f"{COUNTED_STEPS} steps"


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_models_forward_and_backward_read_nothing_back(counted, architecture):
    model = counted(architecture, "bf16", 0).at("model")
    assert not model, f"{architecture}: {model} over {COUNTED_STEPS} steps"


GUARDED = [("fp32", 0, "skip"), ("fp16", 0, "skip"), ("bf16", 0, "skip"), ("bf16", 0, "rollback"),
           ("bf16", 1, "rollback"), ("bf16", 2, "rollback")]


@pytest.mark.parametrize(("precision", "stage", "guard"), GUARDED, ids=[f"{p}-zero{s}-{g}" for p, s, g in GUARDED])
def test_the_spike_guard_reads_nothing_back_between_logging_steps(counted, precision, stage, guard):
    reads = counted("roberta", precision, stage, guard)
    # DeepSpeed's own copies at ZeRO 1-3 are the engine test's (STEP_COPIES); the guard adds none.
    found = {what: n for what, n in reads.at("engine").items()
             if not (what == HOST_TO_DEVICE and (precision, stage) in STEP_COPIES)}
    assert not found, f"{precision} ZeRO {stage} {guard}: {found} over {COUNTED_STEPS} steps"
    records = [json.loads(line) for line in (reads.folder / "metrics.jsonl").read_text().splitlines()]
    if guard == "skip":  # the planted spike was judged and left out inside the counted steps, read at the end
        assert [r["spike_outliers"] for r in records if "spike_outliers" in r] == [[SPIKE_AT]]


CONTRASTIVE = [("roberta", 0), ("roberta", 1), ("roberta", 2), ("roberta", 3), ("modernbert", 0), ("bert", 0)]


@pytest.mark.parametrize(("architecture", "stage"), CONTRASTIVE, ids=[f"{a}-zero{s}" for a, s in CONTRASTIVE])
def test_the_span_contrastive_term_reads_nothing_back_between_logging_steps(counted, architecture, stage):
    """The span loss (`contrastive.weight` 1) at bf16 on every ZeRO stage: its spans come with the batch, its pooling
    and loss stay on the device, and its terms reach the log at the logging step only."""
    reads = counted(architecture, "bf16", stage, contrastive=True)
    assert not reads.at("model"), f"{architecture} ZeRO {stage}: {reads.at('model')} over {COUNTED_STEPS} steps"
    # DeepSpeed's own reads and copies are the engine tests' (STEP_READS, STEP_COPIES); the span loss adds none.
    engine = {what: n for what, n in reads.at("engine").items()
              if not (what == HOST_TO_DEVICE and ("bf16", stage) in STEP_COPIES) and ("bf16", stage) not in STEP_READS}
    assert not engine, f"{architecture} ZeRO {stage}: {engine} over {COUNTED_STEPS} steps"
    records = [json.loads(line) for line in (reads.folder / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if "train/loss" in r]
    assert logged["step"] == WARM_STEPS + COUNTED_STEPS and logged["train/span_loss"] > 0
    assert logged["train/loss"] == pytest.approx(logged["train/mlm_loss"] + logged["train/span_loss"], rel=1e-5)


def shipped_optimizers() -> list[tuple[str, str, int, float]]:
    """(optimizer, precision, ZeRO stage, gradient clipping) of every shipped pretraining config (configs/ and
    configs/recipes/) that trains with LAMB or StableAdamW, and fp16 for each (torch's GradScaler's path)."""
    from pipeline.pretrain.config import TrainConfig

    found = set()
    for path in sorted([*(ROOT / "configs").glob("*.json"), *(ROOT / "configs" / "recipes").glob("*.json")]):
        data = json.loads(path.read_text())
        name, train = data.get("optimizer", {}).get("name", "adamw"), data.get("train", {})
        if name in ("lamb", "stableadamw"):
            clipping = float(train.get("gradient_clipping", TrainConfig.gradient_clipping))
            found |= {(name, precision, train.get("zero_stage", 0), clipping)
                      for precision in (train.get("precision", "fp32"), "fp16")}
    return sorted(found)


RECIPE_OPTIMIZERS = shipped_optimizers()


@pytest.mark.parametrize(("optimizer", "precision", "stage", "clipping"), RECIPE_OPTIMIZERS,
                         ids=[f"{o}-{p}-zero{s}-clip{c:g}" for o, p, s, c in RECIPE_OPTIMIZERS])
def test_the_recipes_optimizers_read_nothing_back_between_logging_steps(counted, optimizer, precision, stage,
                                                                        clipping):
    """LAMB and StableAdamW as the shipped configs run them (fp16: torch's GradScaler hands them `found_inf`), with
    the spike guard's rollback on: no read and no host-to-device copy."""
    assert {o for o, *_ in RECIPE_OPTIMIZERS} == {"lamb", "stableadamw"}, "a shipped config trains with each"
    reads = counted("roberta", precision, stage, "rollback", optimizer, clipping)
    assert not reads.at("engine"), f"{optimizer} {precision}: {reads.at('engine')} over {COUNTED_STEPS} steps"


def test_an_item_and_a_host_to_device_copy_planted_in_the_step_are_counted(tmp_path, process_group, roberta_shards,
                                                                           bpe_tokenizer_dir, monkeypatch):
    from pipeline.pretrain.step.step_sync import StepSync

    record = StepSync.record

    def planted(self, step, micro_losses, extras, tokens):
        micro_losses[0].item()
        torch.tensor([float(step)], device=micro_losses[0].device)  # a host value made a device tensor
        return record(self, step, micro_losses, extras, tokens)

    monkeypatch.setattr(StepSync, "record", planted)
    reads = train_counting(tmp_path / "out", roberta_shards, bpe_tokenizer_dir, "roberta", "fp32", 0, monkeypatch)
    assert reads.at("engine") == {"_local_scalar_dense": COUNTED_STEPS, HOST_TO_DEVICE: COUNTED_STEPS}
