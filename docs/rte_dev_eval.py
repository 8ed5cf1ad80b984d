"""fairseq's MNLI dev-set evaluation loop, on RTE, with the hub interface (the README's example, runnable).

    python docs/rte_dev_eval.py FINETUNE_OUTPUT_DIR GLUE_DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from pipeline.hub import Encoder  # noqa: E402

model_dir, glue_dir = sys.argv[1], Path(sys.argv[2])
encoder = Encoder.from_pretrained(model_dir)  # a fine-tuning output: its head is named after the task
label_map = dict(enumerate(encoder.labels("rte")))  # {0: 'entailment', 1: 'not_entailment'}
ncorrect, nsamples = 0, 0
encoder.eval()
with torch.no_grad(), open(glue_dir / "RTE" / "dev.tsv", encoding="utf-8") as fin:
    fin.readline()
    for line in fin:
        index, sent1, sent2, target = line.rstrip("\n").split("\t")
        tokens = encoder.encode(sent1, sent2, max_length=128)  # truncated as in fine-tuning
        prediction = encoder.predict("rte", tokens).argmax().item()
        ncorrect += int(label_map[prediction] == target)
        nsamples += 1
print("| Accuracy: ", float(ncorrect) / float(nsamples))
