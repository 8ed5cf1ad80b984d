"""A hub name (NAME or ORG/NAME) is told from a local path by one rule, used by every stage."""

from __future__ import annotations

import pytest

from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import is_hub_name, local_or_hub


@pytest.mark.parametrize("name", ["roberta-base", "FacebookAI/roberta-base", "google-bert/bert-base-uncased",
                                  "org_1/model.v2"])
def test_hub_names_are_recognised_with_or_without_an_organisation(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_name(name)
    assert local_or_hub(name, "tokenizer") == name


@pytest.mark.parametrize("text", ["./missing", "/abs/missing", "a/b/c", "~/x", "../up"])
def test_paths_that_do_not_exist_are_clear_errors(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not is_hub_name(text)
    with pytest.raises(PipelineError, match="no such folder"):
        local_or_hub(text, "--model")


def test_an_existing_folder_wins_over_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert not is_hub_name("org/model")
    assert local_or_hub("org/model", "tokenizer") == "org/model"


def test_an_org_slash_name_tokenizer_reaches_the_hub_loader_not_a_folder_check(tmp_path, monkeypatch):
    """`ORG/NAME` used to be refused as a missing folder; offline it now fails in the hub loader instead,
    at once: offline mode set after huggingface_hub read it is still honoured, and no address is looked up."""
    import socket

    import huggingface_hub.constants

    from pipeline.data.tokenizer import load_tokenizer

    looked_up = []

    def no_network(host, *args, **kwargs):
        looked_up.append(host)
        raise OSError("no network in tests")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # as read before the variable was set
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PipelineError) as err:
        load_tokenizer("FacebookAI/roberta-base")
    assert "does not exist" not in str(err.value) and "cannot load tokenizer" in str(err.value)
    assert looked_up == []
