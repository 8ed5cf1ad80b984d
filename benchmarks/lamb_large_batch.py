"""LAMB against AdamW at a large global batch and a learning rate scaled up for it, on CPU.

    python benchmarks/lamb_large_batch.py [--batch 512] [--seq-len 64] [--steps 40] [--lr 0.02 0.05]

Both optimizers train the same freshly initialised encoder (2 layers, hidden 128, sparse MLM
head, the embedded corpus tokenized with a 4,000-entry BPE trained here) on the same batches and
masks, with the pipeline's own pieces: `parameter_groups` (no decay on biases and LayerNorm),
the warmup-then-linear-decay schedule (schedules.py, warmup a quarter of the steps), gradient
clipping at 1.0, and, for LAMB, the optimizer `engine.client_optimizer` gives a CPU run; AdamW is
torch's, as DeepSpeed's `torch_adam` path builds it. The loop is plain torch rather than DeepSpeed
to keep the comparison about the optimizer step alone. Reported: the MLM loss on a fixed
validation batch at the start and the end, and the highest and lowest along the way.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from result_record import BenchmarkRecord  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=512, help="global batch in sequences")
    p.add_argument("--micro-batch", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, nargs="+", default=[0.02, 0.05])
    args = p.parse_args()
    with BenchmarkRecord("lamb_large_batch", argv=sys.argv) as rec:
        measure(args, rec)


def measure(args: argparse.Namespace, rec: BenchmarkRecord) -> None:
    import numpy as np
    import torch

    from pipeline.data.default_corpus import write_embedded_corpus
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage
    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer, train_tokenizer
    from pipeline.pretrain.config import MaskingConfig, ModelConfig, PretrainConfig, ScheduleConfig
    from pipeline.pretrain.engine import client_optimizer, lr_scheduler, optimizer_groups
    from pipeline.pretrain.masking import EVAL_STREAM, build_masker
    from pipeline.pretrain.model import build_model
    from pipeline.pretrain.plateau import unigram_entropy_nats
    from pipeline.pretrain.schedules import Schedule, segments

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.jsonl"
        write_embedded_corpus(corpus)
        texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
        train_tokenizer(texts, "bpe", 4000, tmp / "tok", model_max_length=args.seq_len)
        run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tmp / "tok"), seq_len=args.seq_len,
                                  out=str(tmp / "shards"), workers=2, val_fraction=0.05, quiet=True))
        tokenizer = load_tokenizer(str(tmp / "tok"))
        info = describe_tokenizer(tokenizer)
        train = np.asarray(TokenCache(tmp / "shards", "train", tmp / "cache").fields["input_ids"][:]).astype(np.int64)
        val = np.asarray(TokenCache(tmp / "shards", "val", tmp / "cache").fields["input_ids"][:256]).astype(np.int64)

    masker = build_masker(MaskingConfig(), tokenizer, info.vocab_size, info.mask_id, seed=0)
    # The plateau's level on these validation tokens (pipeline/pretrain/plateau.py): the loss of frequencies alone.
    entropy = unigram_entropy_nats(np.bincount(val[~np.isin(val, tokenizer.all_special_ids)]))
    val_ids, val_labels = (torch.from_numpy(a) for a in masker(val, 0, np.arange(len(val)), EVAL_STREAM))
    model_config = ModelConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    schedule = ScheduleConfig(warmup_steps=args.steps // 4, decay="linear")
    steps_per_epoch = len(train) // args.batch

    def run(name: str, lr: float) -> list[float]:
        torch.manual_seed(0)
        model = build_model(model_config, info, args.seq_len)
        config = PretrainConfig(model=model_config, schedule=schedule)
        config.optimizer.name, config.optimizer.lr, config.optimizer.betas = name, lr, (0.9, 0.999)
        groups = optimizer_groups(model, config, cuda=False)
        o = config.optimizer
        optimizer = client_optimizer(groups, config, cuda=False) or torch.optim.AdamW(
            groups, lr=o.lr, betas=o.betas, eps=o.eps)
        scheduler = lr_scheduler(optimizer, Schedule(segments(schedule, start=0, end=args.steps,
                                                              warmup=schedule.warmup_steps)))

        def val_loss() -> float:
            model.eval()
            with torch.no_grad():
                loss = model(input_ids=val_ids, labels=val_labels)["loss"].item()
            model.train()
            return loss

        losses = [val_loss()]
        for step in range(args.steps):
            epoch, within = divmod(step, steps_per_epoch)
            order = np.random.default_rng([0, epoch]).permutation(len(train))
            rows = order[within * args.batch: (within + 1) * args.batch]
            for start in range(0, args.batch, args.micro_batch):
                part = rows[start: start + args.micro_batch]
                ids, labels = (torch.from_numpy(a) for a in masker(train[part], epoch, part))
                loss = model(input_ids=ids, labels=labels)["loss"] * (len(part) / args.batch)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(val_loss())
            print(f"  {name} lr {lr}: step {step + 1} validation MLM loss {losses[-1]:.3f}", file=sys.stderr)
        return losses

    results = {(name, lr): run(name, lr) for lr in args.lr for name in ("adamw", "lamb")}
    print(f"global batch {args.batch} × {args.seq_len} tokens, {args.steps} steps (warmup {schedule.warmup_steps}, "
          f"then linear decay), {len(train)} train sequences, validation MLM loss on 256 fixed sequences; their "
          f"unigram entropy (the plateau's level) is {entropy:.3f} nats\n")
    print("| optimizer | peak LR | start | highest | lowest | end | end − start |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for (name, lr), losses in results.items():
        finite = [x for x in losses if np.isfinite(x)]
        print(f"| {name} | {lr:g} | {losses[0]:.3f} | {max(losses):.3f} | {min(finite):.3f} | {losses[-1]:.3f} | "
              f"{losses[-1] - losses[0]:+.3f} |")
        rows.append({"optimizer": name, "peak LR": f"{lr:g}", "start": f"{losses[0]:.3f}",
                     "highest": f"{max(losses):.3f} (step {losses.index(max(losses))})", "lowest": f"{min(finite):.3f}",
                     "end": f"{losses[-1]:.3f}", "end − start": f"{losses[-1] - losses[0]:+.3f}"})
    rec.table(f"validation MLM loss, global batch {args.batch} × {args.seq_len} tokens, {args.steps} steps "
              f"(warmup {schedule.warmup_steps}, then linear decay), {len(train)} train sequences; unigram entropy of "
              f"the validation tokens {entropy:.3f} nats", rows)


if __name__ == "__main__":
    main()
