"""The DeepSpeed internals the step patches (pipeline/pretrain/step/deepspeed_patches.py) are checked before anything
is patched: a DeepSpeed without one of them is refused, naming its version and the missing part, rather than stepped
with DeepSpeed's own host-side parts silently back in. And what the pin in pyproject.toml allows is what was tested.
"""

from __future__ import annotations

import re
import tomllib

import pytest
from helpers import ROOT

from pipeline.common.errors import PipelineError
from pipeline.common.processes.topology import import_deepspeed
from pipeline.pretrain.step import deepspeed_patches
from pipeline.pretrain.step.deepspeed_patches import PATCH_TARGETS, TESTED_DEEPSPEED, check_patch_targets

deepspeed = import_deepspeed()
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402


@pytest.fixture
def another_deepspeed(monkeypatch):
    """The installed DeepSpeed claiming another version; each test takes something of it away."""
    monkeypatch.setattr(deepspeed, "__version__", "0.99.1")
    check_patch_targets.cache_clear()
    yield monkeypatch
    check_patch_targets.cache_clear()


def refusal() -> str:
    with pytest.raises(PipelineError) as err:
        check_patch_targets()
    return str(err.value)


def test_the_installed_deepspeed_is_the_tested_one_and_has_every_target():
    assert deepspeed.__version__ == TESTED_DEEPSPEED
    assert deepspeed_patches.target_problems() == []
    check_patch_targets.cache_clear()
    check_patch_targets()


def test_pyproject_pins_the_tested_deepspeed():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in dependencies if re.match(r"deepspeed\b", d)]
    assert pin.replace(" ", "") == f"deepspeed=={TESTED_DEEPSPEED}"


def test_a_deepspeed_without_a_patched_method_is_refused_by_name_with_its_version(another_deepspeed):
    another_deepspeed.delattr(DeepSpeedEngine, "clip_fp32_gradients")
    message = refusal()
    assert "DeepSpeed 0.99.1 is installed" in message
    assert "DeepSpeedEngine.clip_fp32_gradients: missing" in message
    assert f"deepspeed=={TESTED_DEEPSPEED}" in message


def test_a_replaced_method_that_takes_other_arguments_is_refused(another_deepspeed):
    another_deepspeed.setattr(DeepSpeedZeroOptimizer, "unscale_and_clip_grads",
                              lambda self, grad_groups_flat, total_norm, apply_scale=True: None)
    message = refusal()
    assert "0.99.1" in message
    assert ("DeepSpeedZeroOptimizer.unscale_and_clip_grads: takes (self, grad_groups_flat, total_norm, apply_scale)"
            in message)


def test_an_attribute_the_engine_no_longer_reads_is_refused(another_deepspeed):
    """A version whose backward no longer reads `enable_backward_allreduce` would all-reduce a second time beside
    torch's reducer, or on one rank; one whose model step no longer reads the GradScaler would not scale fp16."""

    def backward_epilogue(self):
        self.allreduce_gradients()

    def take_model_step(self, lr_kwargs):
        self.clip_fp32_gradients()
        self.optimizer.step()

    another_deepspeed.setattr(DeepSpeedEngine, "_backward_epilogue", backward_epilogue)
    another_deepspeed.setattr(DeepSpeedEngine, "_take_model_step", take_model_step)
    message = refusal()
    assert "DeepSpeedEngine._backward_epilogue: no longer uses enable_backward_allreduce" in message
    assert "DeepSpeedEngine._take_model_step: no longer uses torch_autocast_z0_gradscaler" in message
    assert "clip_fp32_gradients," not in message  # still called: only what is missing is named


def test_a_missing_class_is_refused(another_deepspeed):
    another_deepspeed.delattr("deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer")
    assert "deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer: missing" in refusal()


def test_every_target_names_why_it_is_patched():
    assert len({(t.owner, t.name) for t in PATCH_TARGETS}) == len(PATCH_TARGETS)
    assert all(t.why for t in PATCH_TARGETS)
