"""A new MLflow sqlite store is a copy of a template migrated once per environment: MLflow opens it as its own, and
no run pays the migrations again."""

from __future__ import annotations

import pytest

from pipeline.tracking import sqlite_store
from pipeline.tracking.mlflow_run import MlflowSink


@pytest.fixture
def template_in(tmp_path, monkeypatch):
    """The environment's template folder, empty, in tmp_path."""
    folder = tmp_path / "environment" / "mlflow_store"
    monkeypatch.setattr(sqlite_store, "template_folder", lambda: folder)
    return folder


def test_the_first_new_store_makes_the_template_and_later_ones_copy_it_without_migrating(template_in, tmp_path,
                                                                                          monkeypatch):
    import mlflow.store.db.utils
    from mlflow.tracking import MlflowClient

    first = MlflowSink(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "tests", "first", None, flush_seconds=5.0)
    assert first.started and sqlite_store.template_path().is_file()

    def no_migrations(engine):
        raise AssertionError("a store copied from the template ran MLflow's migrations")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", no_migrations)
    uri = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    second = MlflowSink(uri, "tests", "second", None, flush_seconds=5.0, params={"lr": 0.001})
    assert second.started
    second.log({"train/loss": 0.5}, 3)
    second.close()
    first.close()
    client = MlflowClient(uri)  # MLflow reads the copy as its own: its runs, its Default experiment
    run = client.get_run(second.run_id)
    assert run.data.metrics == {"train/loss": 0.5} and run.data.params == {"lr": "0.001"}
    assert run.info.status == "FINISHED"
    assert client.get_experiment("0").name == "Default"


def test_an_existing_store_is_never_replaced(template_in, tmp_path):
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"someone's store")
    assert not sqlite_store.start_from_template(f"sqlite:///{store}")
    assert store.read_bytes() == b"someone's store" and not template_in.exists()


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "sqlite://", "sqlite:///:memory:", "databricks"])
def test_only_a_sqlite_file_is_made_from_the_template(uri):
    assert sqlite_store.sqlite_file(uri) is None
    assert not sqlite_store.start_from_template(uri)


def test_a_relative_sqlite_path_is_read_as_sqlalchemy_reads_it():
    assert str(sqlite_store.sqlite_file("sqlite:///runs/mlflow.db?timeout=20")) == "runs/mlflow.db"
    assert str(sqlite_store.sqlite_file("sqlite:////abs/mlflow.db")) == "/abs/mlflow.db"
