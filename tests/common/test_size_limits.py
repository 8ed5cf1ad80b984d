"""Config values that would allocate absurd memory are refused at load, each naming its key and the bound.

Generated (hypothesis, seeded): for each size key of the pretraining config, the fine-tuning config,
the shard stage's and the tokenizer's options, values from just past the bound to 10^18 (seq_len 10^9,
micro batch 10^9, vocabulary 10^12, …). Loading checks only: nothing is allocated or read.
"""

from __future__ import annotations

import json

import pytest
from generated_cases import GENERATED, count, write_counts
from helpers import ROOT, tiny_pretrain_config
from hypothesis import given
from hypothesis import strategies as st

from pipeline.common.config import size_limits as lim
from pipeline.common.config.tree import ConfigError

PRETRAIN_KEYS = {  # --set key → its bound
    "train.micro_batch_size": lim.MAX_MICRO_BATCH, "train.global_batch_size": lim.MAX_GLOBAL_BATCH,
    "train.eval_sequences": lim.MAX_GLOBAL_BATCH, "model.hidden_size": lim.MAX_MODEL_WIDTH,
    "model.intermediate_size": lim.MAX_MODEL_WIDTH, "model.num_hidden_layers": lim.MAX_LAYERS,
    "model.num_attention_heads": lim.MAX_LAYERS, "model.type_vocab_size": lim.MAX_VOCAB,
}
PHASE_KEYS = {"seq_len": lim.MAX_SEQ_LEN, "micro_batch_size": lim.MAX_MICRO_BATCH,
              "global_batch_size": lim.MAX_GLOBAL_BATCH}
FINETUNE_KEYS = {
    "data.max_seq_len": lim.MAX_SEQ_LEN, "data.doc_stride": lim.MAX_SEQ_LEN, "data.n_best": lim.MAX_SEQ_LEN,
    "data.max_answer_length": lim.MAX_SEQ_LEN, "train.batch_size": lim.MAX_GLOBAL_BATCH,
    "train.micro_batch_size": lim.MAX_MICRO_BATCH, "train.eval_batch_size": lim.MAX_MICRO_BATCH,
}


@pytest.fixture(scope="module", autouse=True)
def report_counts(tmp_path_factory):
    yield
    write_counts(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def pretrain_config(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    path = root / "pretrain.json"
    data = tiny_pretrain_config(root / "shards", root / "tok", root / "out")
    data["phases"] = [{"name": "short", "shards": str(root / "shards"), "steps_fraction": 0.5},
                      {"name": "long", "shards": str(root / "shards"), "steps_fraction": 0.5}]
    path.write_text(json.dumps(data))
    return path


def beyond(bound: int):
    return st.one_of(st.integers(bound + 1, 10**18), st.sampled_from([10**9, 10**12, 2**31, 2**63 - 1]))


def assert_names_the_bound(err: ConfigError, key: str, bound: int) -> None:
    mine = [p for p in err.problems if p.startswith(key + ":")]
    assert mine, err.problems
    assert any(f"above the bound of {bound:,}" in p and "size_limits.py" in p for p in mine), mine


@GENERATED
@given(data=st.data())
def test_absurd_pretraining_sizes_are_refused_at_load(pretrain_config, data):
    from pipeline.pretrain.preflight import load_pretrain_config

    count("config values allocating absurd memory")
    if data.draw(st.booleans(), label="a phase key"):
        name = data.draw(st.sampled_from(sorted(PHASE_KEYS)), label="key")
        i = data.draw(st.integers(0, 1), label="phase")
        key, bound, override = f"phases[{i}].{name}", PHASE_KEYS[name], None
        config = json.loads(pretrain_config.read_text())
        config["phases"][i][name] = data.draw(beyond(bound), label="value")
        path = pretrain_config.with_name(f"phase-{name}.json")
        path.write_text(json.dumps(config))
    else:
        key = data.draw(st.sampled_from(sorted(PRETRAIN_KEYS)), label="key")
        bound, path = PRETRAIN_KEYS[key], pretrain_config
        override = f"{key}={data.draw(beyond(bound), label='value')}"
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(path, [override] if override else [], check_files=False)
    assert_names_the_bound(err.value, key, bound)


@GENERATED
@given(key=st.sampled_from(sorted(FINETUNE_KEYS)), data=st.data())
def test_absurd_fine_tuning_sizes_are_refused_at_load(key, data):
    from pipeline.finetune.preflight import load_finetune_config

    count("config values allocating absurd memory")
    bound = FINETUNE_KEYS[key]
    value = data.draw(beyond(bound), label="value")
    task = ROOT / "configs" / "tasks" / "squad.json"
    with pytest.raises(ConfigError) as err:
        load_finetune_config(task, [f"{key}={value}"], check_files=False)
    assert_names_the_bound(err.value, key, bound)


@GENERATED
@given(which=st.sampled_from(["--seq-len", "--shard-size", "--vocab-size", "--model-max-length"]), data=st.data())
def test_absurd_shard_and_tokenizer_options_are_refused(which, data):
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.tokenizer_options import TokenizerOptions

    count("config values allocating absurd memory")
    bounds = {"--seq-len": lim.MAX_SEQ_LEN, "--shard-size": lim.MAX_GLOBAL_BATCH, "--vocab-size": lim.MAX_VOCAB,
              "--model-max-length": lim.MAX_SEQ_LEN}
    value = data.draw(beyond(bounds[which]), label="value")
    if which in ("--seq-len", "--shard-size"):
        options = ShardOptions(inputs=("x",), tokenizer="t", out="o", seq_len=value if which == "--seq-len" else 64,
                               shard_size=value if which == "--shard-size" else 100)
    else:
        options = TokenizerOptions(inputs=("x",), out="o", vocab_size=value if which == "--vocab-size" else None,
                                   model_max_length=value if which == "--model-max-length" else 512)
    problems = [p for p in options.problems() if p.startswith(which + ":")]
    assert problems and f"above the bound of {bounds[which]:,}" in problems[0]


def test_the_shipped_configs_are_far_inside_the_bounds():
    """The bounds refuse typos, never a real run: the largest shipped preset uses a small fraction of each."""
    from pipeline.pretrain.preflight import load_pretrain_config

    large = load_pretrain_config(ROOT / "configs" / "large.json", cuda=True, check_files=False)
    assert large.train.global_batch_size * 100 < lim.MAX_GLOBAL_BATCH
    assert large.model.hidden_size * 10 < lim.MAX_MODEL_WIDTH
