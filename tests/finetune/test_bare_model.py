"""Fine-tuning reaches the model inside its wrappers without importing DeepSpeed (7 s a process on a 2-core CPU)."""

from __future__ import annotations

import subprocess
import sys

from helpers import ROOT

PROBE = """
import sys
import torch
import torch.distributed as dist
from pipeline.finetune.loop.accelerator import bare_model, build_accelerator

model = torch.nn.Linear(2, 2)
prepared = build_accelerator("fp32", cpu=True).prepare(model)
assert bare_model(prepared) is model
assert bare_model(torch.compile(model)) is model  # the wrapper only: nothing compiles until it is called
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
assert bare_model(torch.nn.parallel.DistributedDataParallel(model)) is model
bare_model(prepared).load_state_dict(bare_model(prepared).state_dict())
assert "deepspeed" not in sys.modules, "reaching the model imported deepspeed"
print("ok")
"""


def test_the_bare_model_is_found_inside_ddp_and_compile_without_importing_deepspeed():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
