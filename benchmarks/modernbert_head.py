"""ModernBERT's MLM head at masked positions: the pipeline's head against the model's own `sparse_prediction`.

    python benchmarks/modernbert_head.py [--rounds 5]

Both gather the masked rows before `decoder(head(·))` and take the mean cross-entropy over them:
the pipeline's `_masked_lm_loss` (what RoBERTa and BERT train with) on the encoder's output, and
ModernBertForMaskedLM's forward with `sparse_prediction` on (what `SparseModernBertForMaskedLM`
trains with). The full-logit head
(`sparse_prediction` false, loss over every position's logits) is the reference. One thread, timed
in CPU time (`time.process_time`), so the arms compare on shared cores; the arms alternate round by
round and the best round of each counts. Shape: 4 layers, hidden 256, GeGLU 384, vocabulary 50,368
(ModernBERT's), seq 128, batch 16, 30% masked, fp32, forward + backward.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.result_record import BenchmarkRecord  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    a = p.parse_args()
    torch.set_num_threads(1)
    from transformers import ModernBertForMaskedLM

    from pipeline.data.tokenizer import TokenizerInfo
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.model import _masked_lm_loss, build_model

    seq, vocab, masked = 128, 50_368, 0.30
    torch.manual_seed(0)
    ids = torch.randint(5, vocab - 1, (a.batch, seq))
    labels = torch.full((a.batch, seq), -100)
    chosen = torch.rand(a.batch, seq) < masked
    labels[chosen] = ids[chosen]
    shape = ModelConfig(architecture="modernbert", num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                        intermediate_size=384, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    own = build_model(shape, TokenizerInfo("bench", "none", vocab, 0, 2, 1, vocab - 1, ""), seq).train()
    assert own.sparse_prediction  # SparseModernBertForMaskedLM: the model's own sparse prediction
    pipeline_head = ModernBertForMaskedLM(own.config).train()
    pipeline_head.load_state_dict(own.state_dict())
    dense = ModernBertForMaskedLM(own.config).train()
    dense.load_state_dict(own.state_dict())

    def pipeline_loss():
        hidden = pipeline_head.model(input_ids=ids).last_hidden_state
        return _masked_lm_loss(hidden, labels, lambda h: pipeline_head.decoder(pipeline_head.head(h)))

    arms = {"pipeline head (_masked_lm_loss)": pipeline_loss,
            "own sparse_prediction (SparseModernBertForMaskedLM)": lambda: own(input_ids=ids, labels=labels)["loss"],
            "full logits (sparse_prediction false)": lambda: dense(input_ids=ids, labels=labels).loss}
    losses = {name: run().item() for name, run in arms.items()}
    best = {name: float("inf") for name in arms}
    with BenchmarkRecord("modernbert_head", sys.argv) as rec:
        for _ in range(a.rounds):
            for name, run in arms.items():
                start = time.process_time()
                run().backward()
                best[name] = min(best[name], time.process_time() - start)
        reference = best["full logits (sparse_prediction false)"]
        rows = [{"head": name, "step CPU ms (best)": round(1e3 * seconds),
                 "vs full logits": f"{reference / seconds:.2f}×", "loss": round(losses[name], 6)}
                for name, seconds in best.items()]
        for row in rows:
            print(row)
        rec.table(f"4 layers, hidden 256, GeGLU 384, vocabulary 50,368, seq 128, batch {a.batch}, 30% masked; "
                  f"forward + backward, 1 thread, CPU time, best of {a.rounds} rounds", rows)
        rec.headline("own sparse_prediction ÷ pipeline head, step time",
                     round(best["own sparse_prediction (SparseModernBertForMaskedLM)"]
                           / best["pipeline head (_masked_lm_loss)"], 3))

if __name__ == "__main__":
    main()
