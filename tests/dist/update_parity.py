"""Test harness: the pipeline's DeepSpeed engine for 50 steps under ZeRO 0, then ZeRO 2, in one launch; on several
ranks, ZeRO 0's bucketed all-reduce too.

    torchrun --nproc_per_node 2 tests/dist/update_parity.py OUT
    python tests/dist/update_parity.py OUT

The engine is the one `Pretrainer` trains with: `initialize_engine` on a `PretrainConfig` (AdamW groups
without decay on biases and LayerNorms, warmup then linear decay, clipping, accumulation 2), stepped
as the trainer steps it. Rank 0 writes, per stage, every micro batch's loss and the LR of every step
(`zero{stage}.json`) and the final weights (`zero{stage}.pt`), plus the initial weights (`initial.pt`).
tests/pretrain/test_update_parity.py replays the same micro batches through a plain
`torch.optim.AdamW` loop over transformers' `RobertaForMaskedLM` and compares.

On several ranks ZeRO 0 reduces gradients with torch's DDP reducer, in buckets started during the backward
(step/gradient_buckets.py), here cut small (16 KiB) so that a 2-layer model has several: rank 0 also writes the first
step's reduced gradients in fp32 and in a bf16 run (`gradients-{precision}.pt`), the buckets' bytes per step and the
order in which the first boundary backward made gradients ready and started buckets (`buckets.json`).

Then, on any number of ranks, a few ZeRO 0 steps of BERT without its next-sentence loss (`bert.pt`), whose pooler and
next-sentence head get no gradient.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STEPS, MICRO, ACCUMULATION, SEQ_LEN, VOCAB = 50, 4, 2, 32, 200
MASK_ID, PAD_ID = 4, 1
LR, BETAS, EPS, WEIGHT_DECAY, WARMUP, CLIP = 2e-3, (0.9, 0.98), 1e-6, 0.1, 10, 1.0
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def parity_config(world_size: int, stage: int):
    """The run as a pipeline config: global batch = micro × accumulation × world size."""
    from pipeline.pretrain.config import (
        DataConfig,
        ModelConfig,
        OptimizerConfig,
        PretrainConfig,
        ScheduleConfig,
        TrainConfig,
    )

    return PretrainConfig(
        model=ModelConfig(**TINY),
        data=DataConfig(shards="unused", tokenizer="unused"),
        optimizer=OptimizerConfig(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY),
        schedule=ScheduleConfig(warmup_steps=WARMUP, decay="linear", end_lr_ratio=0.0),
        train=TrainConfig(max_steps=STEPS, global_batch_size=MICRO * ACCUMULATION * world_size,
                          micro_batch_size=MICRO, gradient_clipping=CLIP, zero_stage=stage))


def tokenizer_info():
    from pipeline.data.tokenizer import TokenizerInfo

    return TokenizerInfo("parity", "sha256:0", VOCAB, cls_id=0, sep_id=2, pad_id=PAD_ID, mask_id=MASK_ID,
                         backend_json="{}")


def build_hf_config():
    """The transformers config of the run's model (RoBERTa, 2 layers, hidden 64, no dropout)."""
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import hf_config

    return hf_config(ModelConfig(**TINY), tokenizer_info(), SEQ_LEN)


def micro_batch(step: int, index: int) -> dict[str, torch.Tensor]:
    """Micro batch `index` of the global batch of optimizer step `step`: padded rows, 15% masked.

    Tokens follow a Zipf law, so there is something to learn (the unigram frequencies) and the
    gradients carry signal rather than noise that Adam would blow up.
    """
    from pipeline.pretrain.batches.masked_slots import masked_slots

    g = torch.Generator().manual_seed(1000 * step + index)
    zipf = 1.0 / torch.arange(1, VOCAB - 4, dtype=torch.float64)
    ids = 5 + torch.multinomial(zipf, MICRO * SEQ_LEN, replacement=True, generator=g).reshape(MICRO, SEQ_LEN)
    lengths = torch.randint(SEQ_LEN // 2, SEQ_LEN + 1, (MICRO,), generator=g)
    attention = (torch.arange(SEQ_LEN)[None, :] < lengths[:, None]).long()
    ids[attention == 0] = PAD_ID
    chosen = (torch.rand(ids.shape, generator=g) < 0.15) & (attention == 1)
    chosen[:, 1] = True  # at least one masked token per row
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(chosen, torch.full_like(ids, MASK_ID), ids), **masked_slots(labels),
            "attention_mask": attention}


def watch_gradients(engine) -> None:
    """Add `("ready", parameter index)` to the reducer's events as each gradient is accumulated in the backward, so
    that they show, in order, which buckets started before the backward had made the last gradient ready."""
    for index, param in enumerate(engine.module.parameters()):
        param.register_post_accumulate_grad_hook(lambda _, i=index: engine.gradient_buckets.events.append(("ready", i)))


BERT_STEPS = 4


def bert_without_next_sentence_loss(topology, out: Path) -> None:
    """BERT without its next-sentence loss, at ZeRO 0 for `BERT_STEPS` steps of the same global batches: its pooler
    and next-sentence head get no gradient. Rank 0 writes the initial and final weights, the parameters the first
    step's boundary backward left without a gradient, and that backward's events on several ranks (`bert.pt`)."""
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.step.engine import initialize_engine
    from pipeline.pretrain.guard.spike_guard import SpikeGuard

    config = parity_config(2, 0)  # the same global batch on 1 rank (accumulation 4) as on 2 (accumulation 2)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, architecture="bert",
                                                                   next_sentence_loss=False))
    phases = resolve_phases(config)
    plan = phases[0].plan(topology.world_size)
    torch.manual_seed(0)
    model = build_model(config.model, tokenizer_info(), SEQ_LEN)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    engine = initialize_engine(model, config, plan, schedule=lr_schedule(config, phases),
                               guard=SpikeGuard(config, "cpu", topology.world_size))
    engine.train()
    several = topology.world_size > 1
    if several:
        watch_gradients(engine)
    record = {"initial": initial}
    for step in range(BERT_STEPS):
        for micro in range(plan.accumulation):
            engine.backward(engine(**micro_batch(step, plan.micro_batch_index(topology.rank, micro)))["loss"])
            if step == 0 and micro == plan.accumulation - 1:
                record["no_gradient"] = sorted(n for n, p in engine.module.named_parameters() if p.grad is None)
                record["events"] = list(engine.gradient_buckets.events) if several else []
            engine.step()
    record["final"] = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    if topology.is_main:
        torch.save(record, out / "bert.pt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args()
    from pipeline.common.processes.topology import prepare_environment

    topology = prepare_environment()
    import torch.distributed as dist

    from pipeline.pretrain.step.engine import initialize_engine
    from pipeline.pretrain.guard.spike_guard import SpikeGuard
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.preflight import arithmetic_problems
    from pipeline.pretrain.plan.schedules import lr_schedule

    from pipeline.pretrain.step import gradient_buckets

    gradient_buckets.BUCKET_CAP_MB = 1 / 64  # 16 KiB: a 2-layer model gets several buckets
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    buckets = {}
    for stage, precision in ((0, "fp32"), (2, "fp32"), (0, "bf16")):
        if precision == "bf16" and topology.world_size == 1:
            break
        config = parity_config(topology.world_size, stage)
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision=precision))
        # its own checks ran when it was built
        problems = arithmetic_problems(config, world_size=topology.world_size, cuda=topology.cuda)
        assert not problems, problems
        phases = resolve_phases(config)
        plan = phases[0].plan(topology.world_size)
        assert plan.accumulation == ACCUMULATION
        torch.manual_seed(0)
        model = build_model(config.model, tokenizer_info(), SEQ_LEN)
        if stage == 0 and topology.is_main:
            torch.save(model.state_dict(), out / "initial.pt")
        engine = initialize_engine(model, config, plan, schedule=lr_schedule(config, phases),
                                   guard=SpikeGuard(config, "cpu", topology.world_size))
        engine.train()
        if stage == 0 and topology.world_size > 1:
            watch_gradients(engine)
        losses, lrs = [], []
        for step in range(STEPS):
            lrs.append(engine.get_lr()[0])
            mine = {}
            for micro in range(plan.accumulation):  # as Pretrainer.train steps the engine
                index = plan.micro_batch_index(topology.rank, micro)
                loss = engine(**micro_batch(step, index))["loss"]
                engine.backward(loss)
                if step == 0 and micro == plan.accumulation - 1 and stage == 0 and topology.world_size > 1:
                    events = list(engine.gradient_buckets.events)
                    reduced = {n: p.grad.detach().clone() for n, p in engine.module.named_parameters()}
                    if topology.is_main:
                        torch.save(reduced, out / f"gradients-{precision}.pt")
                    buckets[precision] = {"bytes": engine.gradient_buckets.bytes_per_step,
                                          "buckets": len({i for what, i in events if what == "started"}),
                                          "events": events}
                engine.step()
                mine[index] = loss.item()
            if precision == "bf16":
                break  # the first step's gradients are what it is run for
            gathered = [None] * topology.world_size
            dist.all_gather_object(gathered, mine)
            losses.append([merged for _, merged in sorted({k: v for d in gathered for k, v in d.items()}.items())])
        if topology.is_main and precision == "fp32":
            (out / f"zero{stage}.json").write_text(json.dumps({"losses": losses, "lr": lrs,
                                                               "world_size": topology.world_size}))
            torch.save({k: v.detach().clone() for k, v in engine.module.state_dict().items()}, out / f"zero{stage}.pt")
        dist.barrier()
        del engine
    if topology.is_main and buckets:
        (out / "buckets.json").write_text(json.dumps(buckets))
    bert_without_next_sentence_loss(topology, out)


if __name__ == "__main__":
    main()
