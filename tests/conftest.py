"""Shared fixtures: small corpora made on the fly and tokenizers trained on them (no network)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import CHECKOUT_RUNS, make_documents, write_jsonl

_GUARD = Path(__file__).resolve().parent / "runs_guard"
sys.path.insert(0, str(_GUARD))
import checkout_runs  # noqa: E402  (the same module the launched processes' sitecustomize imports)

# No test reaches the network: set before any test module imports huggingface_hub (which reads these once, at
# import), and inherited by every command a test launches. A hub name then fails at once, not after retries.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ[_name] = "1"
# One OpenMP thread per process (set before torch is first imported; every launched rank inherits it). Two pytest
# workers on two cores, each process starting a thread per core, oversubscribe the cores and OpenMP's threads spin
# waiting on each other: on the 2-core AMD EPYC, two tiny pretraining runs side by side took 234-311 s with the
# default threads and 27-44 s with one each. The models here are tiny; a second thread never pays for itself.
os.environ["OMP_NUM_THREADS"] = "1"
# Every process of this session (and each one it starts, through runs_guard/sitecustomize.py) reports a touch of the
# checkout's runs/ into a folder of this pytest process's own; `nothing_touches_the_checkouts_runs` fails the test.
_GUARD_REPORTS = tempfile.mkdtemp(prefix="runs-guard-")
atexit.register(shutil.rmtree, _GUARD_REPORTS, True)
os.environ[checkout_runs.FORBIDDEN_VARIABLE] = str(CHECKOUT_RUNS)
os.environ[checkout_runs.REPORT_VARIABLE] = _GUARD_REPORTS
os.environ["PYTHONPATH"] = os.pathsep.join([str(_GUARD), *filter(None, os.environ.get("PYTHONPATH", "").split(
    os.pathsep))])
checkout_runs.install(str(CHECKOUT_RUNS))


@pytest.fixture(scope="session")
def documents() -> list[str]:
    return make_documents(400)


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory, documents) -> Path:
    from pipeline.data.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "bpe"
    train_tokenizer(documents, "bpe", 400, out, min_frequency=1)
    return out


@pytest.fixture(scope="session")
def wordpiece_tokenizer_dir(tmp_path_factory, documents) -> Path:
    from pipeline.data.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tok") / "wordpiece"
    train_tokenizer(documents, "wordpiece", 300, out, min_frequency=1)
    return out


@pytest.fixture(scope="session")
def corpus_jsonl(tmp_path_factory, documents) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", documents)


@pytest.fixture(scope="session")
def roberta_shards(tmp_path_factory, corpus_jsonl, bpe_tokenizer_dir) -> Path:
    """Full-packed 64-token RoBERTa shards with a validation split."""
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    out = tmp_path_factory.mktemp("shards") / "roberta"
    run_shard_stage(ShardOptions(inputs=(str(corpus_jsonl),), tokenizer=str(bpe_tokenizer_dir), seq_len=64,
                                 out=str(out), workers=1, shard_size=100, val_fraction=0.1, quiet=True))
    return out


@pytest.fixture(scope="session")
def doc_packed_shards(tmp_path_factory, corpus_jsonl, bpe_tokenizer_dir) -> Path:
    """`doc-packed` 64-token shards (whole documents side by side, attention kept per document)."""
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    out = tmp_path_factory.mktemp("shards") / "doc-packed"
    run_shard_stage(ShardOptions(inputs=(str(corpus_jsonl),), tokenizer=str(bpe_tokenizer_dir), seq_len=64,
                                 out=str(out), workers=1, shard_size=100, val_fraction=0.1, pack="doc-packed",
                                 quiet=True))
    return out


@pytest.fixture(scope="session")
def pairs_shards(tmp_path_factory, corpus_jsonl, wordpiece_tokenizer_dir) -> Path:
    """BERT segment-pair shards (for MLM + next-sentence prediction)."""
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    out = tmp_path_factory.mktemp("shards") / "pairs"
    run_shard_stage(ShardOptions(inputs=(str(corpus_jsonl),), tokenizer=str(wordpiece_tokenizer_dir), seq_len=64,
                                 out=str(out), workers=1, shard_size=100, val_fraction=0.1, pack="pairs",
                                 quiet=True))
    return out


LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def process_group():
    """A world of one for a module's in-process engines and trainers, gone afterwards with the variables it set."""
    import torch.distributed as dist

    saved = dict(os.environ)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from pipeline.common.processes.topology import init_process_group, prepare_environment

    topology = prepare_environment()
    import deepspeed.comm

    assert not dist.is_initialized()
    init_process_group(topology, timeout_s=600)  # as the trainer starts it: no shared-memory comm op built
    yield
    deepspeed.comm.destroy_process_group()  # DeepSpeed's own too, so that the next module's world is a new one
    os.environ.clear()
    os.environ.update(saved)


def put_back(before: dict[str, str | None]) -> None:
    """Set each environment variable as it was (unset where it was unset)."""
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def tracking_uri_restored():
    """`mlflow.set_tracking_uri` in a test also sets $MLFLOW_TRACKING_URI, which every later launch of the
    same pytest worker would inherit and track into; it is put back after each test."""
    before = {"MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI")}
    yield
    put_back(before)


@pytest.fixture(autouse=True)
def no_launcher_variables_leak():
    """A test that sets up a world of one in-process must not hand its rendezvous port to later tests."""
    before = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
    yield
    leaked = [name for name in LAUNCHER_VARIABLES if os.environ.get(name) != before[name]]
    put_back({name: before[name] for name in leaked})
    assert not leaked, f"the test left launcher variables set: {leaked}"


@pytest.fixture(autouse=True)
def nothing_touches_the_checkouts_runs():
    """Fail a test that reads or writes the checkout's runs/ (itself, a fixture it uses, or a process it starts).

    Such a test passes on a fresh clone and fails once a user has run the main job, or tries to resume the
    user's run: every test works in its own folder (tmp_path) and names it in the configs it loads.
    """
    yield
    found = checkout_runs.take_findings()
    if found:
        pytest.fail(f"the test touched the checkout's {CHECKOUT_RUNS} (use tmp_path, and set train.output_dir "
                    f"in any shipped config it loads):\n" + "\n".join(found[:20]), pytrace=False)
