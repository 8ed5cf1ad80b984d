"""Which documents fed a training step: each sequence of its global batch, with its corpus, source file and lines.

    python launchers/trace.py RUN_DIR --step N [--json]        (or: roberta-trace)

Computed from the run's record (its newest checkpoint) and its shards, with nothing logged per step: the
order is a function of the step (pipeline/pretrain/plan/stream.py). Steps are numbered as the logs number them
(step N is the N-th optimizer step). `--json` prints one object per sequence and line:
`{"documents": [{"corpus", "file", "line"}], "text": the decoded sequence}`, its special tokens kept
(they mark the documents' boundaries), its padding left out. Shards made before the
shard stage kept document origins still trace to their corpus and text; the documents are then left
empty, and the command says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.common.errors import PipelineError, exit_on_pipeline_error

PREVIEW_CHARS = 160


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a pretraining run folder (train.output_dir)")
    parser.add_argument("--step", type=int, required=True, help="the step, numbered as the logs number them")
    parser.add_argument("--json", action="store_true", help="one JSON object per sequence and line")
    return parser


def trace_step(run_dir: Path, step: int) -> tuple[list[dict], list[str]]:
    """Step `step`'s sequences, in global-batch order, as {"documents", "text"}; and notes on what it cannot name."""
    from pipeline.data.shards.origins import OriginReader
    from pipeline.data.shards.reader import ShardedDataset
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.pretrain.checkpoints.ledger import RollbackEvent, UpdatesSkippedEvent
    from pipeline.pretrain.preflight import recorded_plan

    plan = recorded_plan(run_dir)
    if not 1 <= step <= plan.end_step:
        raise PipelineError(f"--step {step}: the run's steps are 1 to {plan.end_step}")
    notes = []
    if (skipped := plan.skip_at(step - 1)) is not None:
        rollback = next((e for e in plan.ledger.events if isinstance(e, RollbackEvent) and e.steps == skipped), None)
        why = (f"train.skip_steps {skipped.start + 1}:{skipped.stop}" if rollback is None else
               f"steps {skipped.start + 1}:{skipped.stop}, left out by the spike guard's rollback to {rollback.to} "
               f"after outliers at steps {', '.join(map(str, rollback.outliers))}")
        notes.append(f"step {step} was skipped ({why}): no model trained on this batch; it is the one the step would "
                     "have had")
    if any(isinstance(e, UpdatesSkippedEvent) and step in e.steps for e in plan.ledger.events):
        notes.append(f"step {step}'s update was left out by the spike guard (its loss or gradient norm was an "
                     "outlier): the model saw this batch, its gradient was dropped")
    stretch = plan.stretch_at(step - 1)
    corpus, rows, _ = stretch.stream(plan.config.train.seed).step_sequences(step - 1)
    own_tokenizer = Path(run_dir) / "tokenizer"
    tokenizer = load_tokenizer(str(own_tokenizer) if own_tokenizer.is_dir() else plan.config.data.tokenizer)
    sequences = []
    readers = {}
    for c, row in zip(corpus.tolist(), rows.tolist(), strict=True):
        layout = stretch.corpora[c]
        if layout.path not in readers:
            readers[layout.path] = (ShardedDataset(layout.path, "train"), OriginReader(layout.path, "train"))
            if not readers[layout.path][1].available:
                notes.append(f"corpus {layout.name} ({layout.path}): its shards were made before the shard stage "
                             "kept document origins; re-shard it to name the documents")
        shards, origins = readers[layout.path]
        ids = shards[row]["input_ids"][: int(shards[row].get("length", len(shards[row]["input_ids"])))]
        documents = origins.documents([row])[0] if origins.available else []
        sequences.append({"documents": [{"corpus": layout.name, "file": d.file, "line": d.line} for d in documents],
                          # special tokens kept: they mark where one document ends and the next begins
                          "text": tokenizer.decode(ids.tolist(), skip_special_tokens=False),
                          "corpus": layout.name, "row": row})
    return sequences, notes


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sequences, notes = trace_step(args.run_dir, args.step)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for i, sequence in enumerate(sequences):
        if args.json:
            print(json.dumps({"documents": sequence["documents"], "text": sequence["text"]}, ensure_ascii=False))
            continue
        where = "; ".join(f"{d['file']}:{d['line']}" for d in sequence["documents"]) or "documents not recorded"
        text = sequence["text"].replace("\n", " ")
        print(f"[{i}] {sequence['corpus']} row {sequence['row']}: {where}\n    "
              f"{text[:PREVIEW_CHARS]}{'…' if len(text) > PREVIEW_CHARS else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
