"""`masking.eval_probability`: validation batches are masked at their own rate (ModernBERT: train at 30%, report at
15%), the training batches at theirs; left out, validation uses the training rate."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiny_pretrain_config
from test_phases import load
from test_pretrain_distributed import write_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.pretrain.batches.masked_slots import dense_labels
from pipeline.pretrain.batches.stretch_data import PretrainData
from pipeline.pretrain.plan.masking import IGNORE_INDEX, build_masker, eval_probability
from pipeline.pretrain.preflight import prepare_run
from pipeline.pretrain.report.plateau import at_mask_rate


def masked_fraction(batches, keys, special_ids) -> float:
    """Targets per ordinary token (the masker never chooses a special one)."""
    labels = np.concatenate([dense_labels(batches[k]).numpy().ravel() for k in keys])
    targets = np.where(labels != IGNORE_INDEX)[0]
    ids = np.concatenate([batches[k]["input_ids"].numpy().ravel() for k in keys])
    ids[targets] = labels[targets]  # the original tokens where the inputs were corrupted
    return float(len(targets) / (~np.isin(ids, special_ids)).sum())


def test_validation_batches_are_masked_at_eval_probability(tmp_path, roberta_shards, bpe_tokenizer_dir):
    plan = prepare_run(write_config(tmp_path / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, tmp_path / "out", masking={"probability": 0.3, "eval_probability": 0.15})))
    config = plan.config
    tokenizer = load_tokenizer(str(bpe_tokenizer_dir))
    info = describe_tokenizer(tokenizer, str(bpe_tokenizer_dir))
    maskers = [build_masker(config.masking, tokenizer, info.vocab_size, info.mask_id, 0, evaluation=e)
               for e in (False, True)]
    data = PretrainData(plan.stretches[0], BatchPlan.derive(16, 4, 1), maskers[0], seed=0,
                        cache_dir=tmp_path / "cache", tokenizer_fingerprint=info.fingerprint, with_segments=False,
                        eval_masker=maskers[1])
    (val_keys,) = data.eval_sets(64, 4, 0, 1)
    train_keys = [data.stream.micro_batch(step, i) for step in range(4) for i in range(4)]
    specials = tokenizer.all_special_ids
    assert masked_fraction(data.val_batches, val_keys, specials) == pytest.approx(0.15, abs=0.02)
    assert masked_fraction(data.train_batches, train_keys, specials) == pytest.approx(0.3, abs=0.02)


def test_eval_probability_defaults_to_the_training_rate_and_is_checked(tmp_path):
    plain = load(tmp_path, tiny_pretrain_config("s", "t", tmp_path / "o", masking={"probability": 0.3}),
                 check_files=False)
    assert eval_probability(plain.masking) == 0.3
    with pytest.raises(ConfigError, match=r"masking\.eval_probability: must be in \(0, 1\) or null"):
        load(tmp_path, tiny_pretrain_config("s", "t", tmp_path / "o", masking={"eval_probability": 1.5}),
             check_files=False)


def test_a_printed_loss_names_its_masking_rate():
    assert at_mask_rate({"eval/mlm_loss": 5.1, "eval/mask_rate": 0.15}) == " at 15% masking"
    assert at_mask_rate({"eval/mlm_loss": 5.1}) == ""  # runs from before the rate was logged
