"""The reference encoder's folder is found where the package installs it, or named as missing with the fix."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from pipeline.common.errors import PipelineError
from pipeline.models import reference_model


def test_the_folder_inside_the_installed_package_is_found(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=str(tmp_path / "__init__.py")))
    assert reference_model.reference_encoder_folder() == tmp_path / "model"


def test_a_missing_package_names_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(PipelineError, match=r"pip install -e \.\[reference\]"):
        reference_model.reference_encoder_folder()
