"""Exports load DeepSpeed checkpoints with `weights_only=True`: a pickle that would run code is refused."""

from __future__ import annotations

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.pretrain.export.folder import consolidated_state_dict, load_checkpoint_file


class RunsCode:
    def __reduce__(self):
        return (print, ("this ran while loading",))


def test_a_checkpoint_that_would_run_code_is_refused_naming_the_object(tmp_path, capsys):
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}, "extra": RunsCode()}, path)
    with pytest.raises(PipelineError, match=r"mp_rank_00_model_states.pt: refused to load: it holds (builtins.)?print"):
        consolidated_state_dict(tmp_path, zero_stage=0)
    assert "this ran while loading" not in capsys.readouterr().out


def test_tensors_and_deepspeeds_own_types_load(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    path = tmp_path / "optim_states.pt"
    torch.save({"stage": ZeroStageEnum.gradients, "scaler": LossScaler(1.0), "t": torch.arange(3)}, path)
    loaded = load_checkpoint_file(path)
    assert loaded["stage"] == ZeroStageEnum.gradients and torch.equal(loaded["t"], torch.arange(3))
