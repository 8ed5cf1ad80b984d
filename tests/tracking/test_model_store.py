"""MLflow as a model store: a logged model loads back through pyfunc and predicts what the hub interface does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import WORDS
from model_folders import save_export, save_finetune_output

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder
from pipeline.tracking.model_store import file_dataset, log_dataset_inputs, log_encoder_model, shard_dataset

LABELS = ("entailment", "not_entailment")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("models", artifact_location=str(root / "artifacts"))
    return {"root": root, "uri": uri, "client": client, "experiment": experiment}


def pairs(n: int) -> list[tuple[str, str]]:
    return [(" ".join(WORDS[i:i + 4]), " ".join(WORDS[i + 3:i + 9])) for i in range(n)]


def test_a_logged_finetuned_model_predicts_the_hub_interfaces_labels(store, bpe_tokenizer_dir):
    import mlflow.pyfunc
    import pandas as pd

    out = store["root"] / "ft"
    save_finetune_output(bpe_tokenizer_dir, out, "rte", LABELS, [(p, LABELS[i % 2]) for i, p in enumerate(pairs(12))])
    run = store["client"].create_run(store["experiment"], run_name="rte-seed1").info.run_id
    uri = log_encoder_model(out / "seed_1" / "model", run, tracking_uri=store["uri"],
                            registered_model_name="rte-tiny")
    expected = Encoder.from_pretrained(out).classify("rte", pairs(12))

    mlflow.set_tracking_uri(store["uri"])
    loaded = mlflow.pyfunc.load_model(f"runs:/{run}/model")
    assert loaded.predict(pd.DataFrame(pairs(12), columns=["text", "text_b"])) == expected
    assert loaded.predict(pairs(12)) == expected
    assert loaded.predict([a for a, _ in pairs(12)]) == Encoder.from_pretrained(out).classify("rte", [a for a, _ in
                                                                                                      pairs(12)])
    assert loaded.predict(pd.DataFrame({"text": ["the river"]})) == \
        Encoder.from_pretrained(out).classify("rte", ["the river"])
    assert mlflow.pyfunc.load_model(uri).metadata.metadata["task"] == "rte"
    version = store["client"].get_latest_versions("rte-tiny")[0]
    assert version.run_id == run


def test_a_logged_export_fills_masks_like_the_hub_interface(store, bpe_tokenizer_dir):
    import mlflow.pyfunc
    import pandas as pd

    export = save_export(bpe_tokenizer_dir, store["root"] / "export")
    run = store["client"].create_run(store["experiment"], run_name="pretrain").info.run_id
    tracking_before = os.environ.get("MLFLOW_TRACKING_URI")
    log_encoder_model(export, run, tracking_uri=store["uri"])
    assert os.environ.get("MLFLOW_TRACKING_URI") == tracking_before  # a later launch tracks where it was told
    mlflow.set_tracking_uri(store["uri"])
    texts = ["the <mask> encoder", "a model reads the <mask>."]
    predicted = mlflow.pyfunc.load_model(f"runs:/{run}/model").predict(pd.DataFrame({"text": texts}))
    encoder = Encoder.from_pretrained(export)
    assert predicted == [encoder.fill_mask(t, topk=1)[0][0] for t in texts]
    with pytest.raises(PipelineError, match="no config.json"):
        log_encoder_model(store["root"], run, tracking_uri=store["uri"])


def is_pickle(path) -> bool:
    """A .pkl/.pickle file, a file that parses whole as a pickle of protocol 2 to 5, or a zip holding one."""
    import pickletools
    import zipfile

    if path.suffix in (".pkl", ".pickle"):
        return True
    data = path.read_bytes()
    if zipfile.is_zipfile(path):  # torch's .bin checkpoints are zips around data.pkl
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith((".pkl", ".pickle")) or archive.read(name)[:1] == b"\x80"
                       for name in archive.namelist())
    if len(data) < 2 or data[0] != 0x80 or not 2 <= data[1] <= 5:  # PROTO opcode and its protocol
        return False
    try:  # a safetensors header length can begin with the same two bytes: a pickle parses to STOP at the end
        ops = list(pickletools.genops(data))
    except Exception:  # noqa: BLE001 - anything that does not parse is not a pickle
        return False
    return ops[-1][0].name == "STOP" and ops[-1][2] == len(data) - 1


def test_a_logged_model_is_stored_as_code_and_loads_without_unpickling(store, bpe_tokenizer_dir, tmp_path,
                                                                      monkeypatch):
    import pickle

    import cloudpickle
    import mlflow.artifacts
    import mlflow.pyfunc
    import yaml

    (tmp_path / "object.pkl").write_bytes(pickle.dumps({"a": 1}))
    (tmp_path / "object.bin").write_bytes(cloudpickle.dumps(LABELS))
    assert is_pickle(tmp_path / "object.pkl") and is_pickle(tmp_path / "object.bin")  # the detector finds them

    export = save_export(bpe_tokenizer_dir, store["root"] / "export-from-code")
    run = store["client"].create_run(store["experiment"], run_name="from-code").info.run_id
    uri = log_encoder_model(export, run, tracking_uri=store["uri"])
    mlflow.set_tracking_uri(store["uri"])
    files = mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / "logged"))
    stored = [p for p in Path(files).rglob("*") if p.is_file()]
    assert [p.name for p in stored if p.name == "model.safetensors"]  # the weights are there
    assert [p for p in stored if is_pickle(p)] == []
    flavor = yaml.safe_load((Path(files) / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["model_code_path"].endswith("encoder_pyfunc.py") and "python_model" not in flavor

    def refuse(*args, **kwargs):
        raise AssertionError("loading the model unpickled something")

    for module in (pickle, cloudpickle):
        monkeypatch.setattr(module, "load", refuse)
        monkeypatch.setattr(module, "loads", refuse)
    texts = ["the <mask> encoder"]
    encoder = Encoder.from_pretrained(export)
    assert mlflow.pyfunc.load_model(uri).predict(texts) == [encoder.fill_mask(t, topk=1)[0][0] for t in texts]


@pytest.mark.slow  # a fresh Python importing torch, transformers and MLflow (59 s here at load 11)
def test_logging_a_model_prints_no_pickle_or_type_hint_warning(store, bpe_tokenizer_dir):
    """In a fresh process, as a trainer logs it: MLflow says nothing about CloudPickle or `predict`'s type hints."""
    import os
    import subprocess
    import sys

    export = save_export(bpe_tokenizer_dir, store["root"] / "export-quiet")
    run = store["client"].create_run(store["experiment"], run_name="quiet").info.run_id
    code = ("import sys; from pipeline.tracking.model_store import log_encoder_model; "
            "print(log_encoder_model(sys.argv[1], sys.argv[2], tracking_uri=sys.argv[3]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONWARNINGS"))}
    done = subprocess.run([sys.executable, "-c", code, str(export), run, store["uri"]], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("models:/")
    assert "CloudPickle" not in done.stderr and "type hints" not in done.stderr


def test_shards_and_task_files_become_dataset_inputs(store, roberta_shards, tmp_path):
    from pipeline.common.atomic_files import sha256_file

    task = tmp_path / "RTE" / "train.tsv"
    task.parent.mkdir()
    task.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    run = store["client"].create_run(store["experiment"], run_name="data").info.run_id
    log_dataset_inputs(run, [shard_dataset(roberta_shards), file_dataset(task, "training")], store["uri"])
    inputs = store["client"].get_run(run).inputs.dataset_inputs
    by_name = {i.dataset.name: i for i in inputs}
    index_sha = sha256_file(roberta_shards / "index.json")
    assert by_name[roberta_shards.name].dataset.digest == index_sha[:32]
    assert json.loads(by_name[roberta_shards.name].dataset.source)["uri"] == str(roberta_shards.resolve())
    assert by_name["RTE/train.tsv"].dataset.digest == sha256_file(task)[:32]
    assert {t.key: t.value for t in by_name["RTE/train.tsv"].tags}["mlflow.data.context"] == "training"
    with pytest.raises(PipelineError, match="no index.json"):
        shard_dataset(tmp_path)


def test_the_trainers_call_logs_model_and_data_to_the_sinks_run_and_registers_it(store, bpe_tokenizer_dir,
                                                                                   roberta_shards):
    from pipeline.tracking.metrics import FanOut, JsonlSink
    from pipeline.tracking.mlflow_run import MlflowSink
    from pipeline.tracking.model_store import record_in_model_store

    export = save_export(bpe_tokenizer_dir, store["root"] / "export-registered")
    mlflow_sink = MlflowSink(store["uri"], "models", "pretrain-registered", None)
    sink = FanOut(JsonlSink(store["root"] / "metrics.jsonl"), mlflow_sink)
    record_in_model_store(sink, export, [shard_dataset(roberta_shards)], registered_model_name="tiny-export")
    sink.close()
    run = store["client"].get_run(mlflow_sink.run_id)
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == [roberta_shards.name]
    assert store["client"].get_latest_versions("tiny-export")[0].run_id == mlflow_sink.run_id
    record_in_model_store(JsonlSink(store["root"] / "other.jsonl"), export)  # no MLflow run: nothing to do
