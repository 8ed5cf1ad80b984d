"""The whole update, over 50 steps: the pipeline's DeepSpeed engine against a plain torch AdamW loop.

The engine (tests/dist/update_parity.py: `initialize_engine` on a `PretrainConfig`, ZeRO 0 and 2,
1 and 2 ranks, accumulation 2, clipping, warmup then linear decay, no weight decay on biases and
LayerNorms) and the loop below (transformers' `RobertaForMaskedLM` with its own full-logit loss,
`torch.optim.AdamW`, `clip_grad_norm_`, torch's `LinearLR` warmup and decay) see the same micro
batches and masks. Every micro batch's loss at every step, and every parameter at the end, agree to
1e-4 relative: the sparse head, the parameter groups, the schedule, the clipping and the gradient
averaging over ranks and micro steps are each the textbook ones.

On two ranks ZeRO 0 reduces its gradients with torch's DDP reducer, in buckets started while the backward runs
(step/gradient_buckets.py): the first step's reduced gradients equal the mean over all four micro batches on one
process (fp32: to rounding; bf16, whose buckets travel in bf16: to bf16's), the first bucket starts before the
backward has made the last gradient ready, and bf16 sends half fp32's bytes. BERT without its next-sentence loss,
whose pooler and next-sentence head get no gradient, overlaps its backward as well, and those heads stay as
initialised on two ranks as on one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import PYTHON, ROOT

HARNESS = ROOT / "tests" / "dist" / "update_parity.py"
spec = importlib.util.spec_from_file_location("update_parity", HARNESS)
parity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parity)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """One plain-python launch (1 rank) and one torchrun launch (2 ranks), side by side; each runs ZeRO 0 then 2."""
    root = tmp_path_factory.mktemp("parity")
    torchrun = [str(Path(PYTHON).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
    procs = {1: subprocess.Popen([PYTHON, str(HARNESS), str(root / "one")], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
             2: subprocess.Popen([*torchrun, str(HARNESS), str(root / "two")], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)}
    for proc in procs.values():
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-4000:]
    return {1: root / "one", 2: root / "two"}


def reference_run(initial: dict[str, torch.Tensor], world_size: int):
    """The textbook loop: per step, the mean of the micro batches' losses, clipped, AdamW, LR schedule."""
    from transformers import RobertaForMaskedLM

    from pipeline.pretrain.batches.masked_slots import dense_labels

    model = RobertaForMaskedLM(parity.build_hf_config())
    model.load_state_dict(initial)
    model.train()
    def no_decay(name: str) -> bool:  # by name, as BERT's and HF's scripts do (the head's norm is `layer_norm`)
        return name.endswith(".bias") or "LayerNorm" in name or "layer_norm" in name

    params = list(model.named_parameters())
    optimizer = torch.optim.AdamW([{"params": [p for n, p in params if not no_decay(n)],
                                    "weight_decay": parity.WEIGHT_DECAY},
                                   {"params": [p for n, p in params if no_decay(n)], "weight_decay": 0.0}],
                                  lr=parity.LR, betas=parity.BETAS, eps=parity.EPS)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / (parity.WARMUP + 1), end_factor=1.0,
                                               total_iters=parity.WARMUP)
    decay_lr = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0,
                                                 total_iters=parity.STEPS - parity.WARMUP)
    schedule = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, decay_lr], milestones=[parity.WARMUP])
    micro_batches = world_size * parity.ACCUMULATION
    losses, lrs, clipped = [], [], 0
    for step in range(parity.STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        row = []
        for index in range(micro_batches):
            batch = parity.micro_batch(step, index)  # HF's loss takes the labels per position
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         labels=dense_labels(batch)).loss
            (loss / micro_batches).backward()
            row.append(loss.item())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), parity.CLIP)
        clipped += int(norm > parity.CLIP)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(row)
    return losses, lrs, model.state_dict(), clipped


@pytest.fixture(scope="module")
def references(engine_runs):
    initial = torch.load(engine_runs[1] / "initial.pt")
    assert all(torch.equal(initial[k], v) for k, v in torch.load(engine_runs[2] / "initial.pt").items())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest on a busy machine
    try:
        return {world: reference_run(initial, world) for world in (1, 2)}
    finally:
        torch.set_num_threads(threads)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖, with ‖b‖ floored at 1e-2: the attention key biases get no gradient (softmax ignores a
    shift shared by all keys), stay near 4e-8 from their zero start in both runs, and their rounding noise
    is no parameter difference. Every other tensor's norm is above the floor (measured: 3e-2 and up)."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-2)).item()


@pytest.mark.slow  # two launches (1 and 2 ranks) of 2 × 50 engine steps, side by side: ~40 s
@pytest.mark.parametrize("stage", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2])
def test_fifty_steps_give_the_same_losses_and_weights_as_a_plain_adamw_loop(engine_runs, references, world_size,
                                                                             stage):
    losses, lrs, weights, clipped = references[world_size]
    run = json.loads((engine_runs[world_size] / f"zero{stage}.json").read_text())
    assert run["world_size"] == world_size
    assert len(run["losses"]) == parity.STEPS and all(len(r) == world_size * parity.ACCUMULATION
                                                      for r in run["losses"])
    assert run["lr"] == pytest.approx(lrs, rel=1e-9, abs=1e-12)  # the pipeline's schedule is torch's LinearLR pair
    worst_loss = max(abs(a - b) / abs(b) for ours, theirs in zip(run["losses"], losses, strict=True)
                     for a, b in zip(ours, theirs, strict=True))
    assert worst_loss < 1e-4, f"loss differs by {worst_loss:.2e} relative"
    final = torch.load(engine_runs[world_size] / f"zero{stage}.pt")
    assert final.keys() == weights.keys()
    worst = max((relative(final[k], weights[k]), k) for k in weights)
    assert worst[0] < 1e-4, f"{worst[1]} differs by {worst[0]:.2e} relative"  # measured: below 1e-6
    whole = relative(torch.cat([final[k].flatten() for k in weights]),
                     torch.cat([w.flatten() for w in weights.values()]))
    assert whole < 1e-5
    # The run exercised what it claims to: clipping bit on some steps, and the model learned.
    assert 0 < clipped
    first, last = (sum(map(sum, rows)) / sum(map(len, rows)) for rows in (losses[:5], losses[-5:]))
    assert last < first - 0.4


def one_process_gradients(initial: dict[str, torch.Tensor], autocast: bool) -> dict[str, torch.Tensor]:
    """The first step's gradient, the mean over the four micro batches two ranks share, on one process (bf16: the
    forward under autocast, as the engine runs it)."""
    from pipeline.models.architectures.hf_model import SparseRobertaForMaskedLM

    model = SparseRobertaForMaskedLM(parity.build_hf_config())
    model.load_state_dict(initial)
    model.train()
    for index in range(2 * parity.ACCUMULATION):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**parity.micro_batch(0, index))["loss"]
        (loss / (2 * parity.ACCUMULATION)).backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.slow
def test_zero_0_on_two_ranks_reduces_in_buckets_during_the_backward_to_one_processes_gradients(engine_runs):
    run = engine_runs[2]
    initial = torch.load(engine_runs[1] / "initial.pt")
    buckets = json.loads((run / "buckets.json").read_text())
    for precision, bound in (("fp32", 1e-5), ("bf16", 1e-2)):
        reduced, reference = torch.load(run / f"gradients-{precision}.pt"), one_process_gradients(
            initial, autocast=precision == "bf16")
        worst = max(relative(reduced[n], g) for n, g in reference.items())
        assert worst < bound, f"{precision}: the reduced gradients are {worst:.2g} from one process's"
        events = [tuple(e) for e in buckets[precision]["events"]]
        assert buckets[precision]["buckets"] > 2
        last_ready = max(i for i, (what, _) in enumerate(events) if what == "ready")
        assert events.index(("started", 0)) < last_ready  # communication began while the backward still ran
    assert buckets["bf16"]["bytes"] * 2 == buckets["fp32"]["bytes"]


@pytest.mark.slow
def test_bert_without_its_next_sentence_loss_overlaps_the_backward_and_keeps_its_unused_heads_on_two_ranks(
        engine_runs):
    one, two = (torch.load(engine_runs[world] / "bert.pt") for world in (1, 2))
    assert all(torch.equal(one["initial"][k], v) for k, v in two["initial"].items())
    unused = sorted(k for k in one["initial"] if k.startswith(("bert.pooler.", "cls.seq_relationship.")))
    assert len(unused) == 4
    # No rank used them, so they keep no gradient, as on one rank: AdamW's weight decay leaves them as they were.
    assert one["no_gradient"] == two["no_gradient"] == unused
    for run in (one, two):
        assert all(torch.equal(run["final"][k], run["initial"][k]) for k in unused)
    trained = [k for k in one["initial"] if k not in unused and k.endswith(".weight")]
    assert all(not torch.equal(one["final"][k], one["initial"][k]) for k in trained)
    worst = max((relative(two["final"][k], one["final"][k]), k) for k in one["final"])
    assert worst[0] < 1e-5, f"{worst[1]} differs by {worst[0]:.2e} between 1 and 2 ranks"  # fp32: rounding only
    # A bucket holding the unused head still started while the backward ran (it is ready from the start).
    events = [tuple(e) for e in two["events"]]
    last_ready = max(i for i, (what, _) in enumerate(events) if what == "ready")
    started = [i for i, (what, _) in enumerate(events) if what == "started"]
    assert started and started[0] < last_ready
    assert len(started) == len({index for what, index in events if what == "started"}) > 2  # each bucket once
