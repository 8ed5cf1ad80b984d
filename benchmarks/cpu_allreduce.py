"""gloo's all-reduce against DeepSpeed's shared-memory op on 2 CPU ranks, at the main job's gradient size and around
it, and what building the op costs (docs/benchmarks.md, "The all-reduce on CPU ranks")."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness

MAIN_JOB_GRADIENT = 799_440
"""Parameters of the main job's export (configs/main-job.json's 2-layer ModernBERT, 2,000-token vocabulary): at ZeRO
0 the engine all-reduces them as one fp32 bucket per optimizer step."""
MAIN_JOB_STEPS = 1600
SIZES = (65_536, MAIN_JOB_GRADIENT, 16_777_216)
STUDY = harness.Study(
    "cpu_allreduce", question="Does pretraining on CPU ranks need DeepSpeed's shared-memory all-reduce op?",
    metric="milliseconds per all-reduce of an fp32 tensor on 2 ranks (median of the repeats); seconds to build the op",
    baseline="gloo: torch.distributed's all-reduce, the one DeepSpeed's training path calls (the op serves only "
    "its inference_all_reduce)", arms=("gloo", "DeepSpeed shared-memory op"))


def worker(out: Path, repeats: int) -> None:
    """On each of 2 ranks: the op loaded from the environment's extensions folder, then each size reduced `repeats`
    times each way, alternating; rank 0 writes the medians."""
    import torch
    import torch.distributed as dist

    from pipeline.common.processes.topology import import_deepspeed, prepare_environment

    prepare_environment()
    deepspeed = import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo")  # with the op, as DeepSpeed starts by itself
    if not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        raise SystemExit("DeepSpeed's shared-memory op did not load")
    arms = {"gloo": dist.all_reduce, "DeepSpeed shared-memory op": torch.ops.deepspeed.inference_all_reduce_}
    results = {}
    for size in SIZES:
        tensor, times = torch.ones(size), {arm: [] for arm in arms}
        for arm, reduce in arms.items():  # the same sum either way
            tensor.fill_(1.0)
            reduce(tensor)
            if tensor[0].item() != dist.get_world_size():
                raise SystemExit(f"{arm}: all-reduce of ones gave {tensor[0].item()}")
        for _ in range(repeats):
            for arm, reduce in arms.items():
                dist.barrier()
                started = time.perf_counter()
                reduce(tensor)
                times[arm].append(time.perf_counter() - started)
        results[size] = {arm: 1000 * statistics.median(t) for arm, t in times.items()}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


def build_seconds() -> float:
    """The op's JIT build in a new extensions folder, as a new environment's first pretraining paid it."""
    with tempfile.TemporaryDirectory() as folder:
        built = harness.launch([sys.executable, "-c", harness.BUILD_OP],
                               env={**harness.cpu_env(), "TORCH_EXTENSIONS_DIR": folder}, capture=True)
    return float(built.output.split()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(Path(sys.argv[2]), int(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--no-build", action="store_true", help="skip timing the op's build in a new folder")
    a = p.parse_args()
    env = harness.cpu_env(1)
    with STUDY.record() as rec:
        built = None if a.no_build else build_seconds()
        harness.build_comm_op()  # the environment's own copy, which the workers load
        out = harness.work_dir("cpu-allreduce") / "times.json"
        # LOCAL_SIZE: the op's shared memory is set up only where it names every rank local, as the deepspeed
        # launcher's does (without it, the op crashed both ranks)
        harness.launch([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, "--worker",
                        out, a.repeats], env={**env, "LOCAL_SIZE": "2"}, quiet=True)
        times = {int(size): arms for size, arms in json.loads(out.read_text()).items()}
        rows = []
        for size, arms in times.items():
            gloo, shm = arms["gloo"], arms["DeepSpeed shared-memory op"]
            rows.append({"fp32 elements": f"{size:,}", "MiB": f"{size * 4 / 2**20:.2f}",
                         "gloo ms": f"{gloo:.3f}", "shared-memory op ms": f"{shm:.3f}",
                         "gloo ÷ op": f"{gloo / shm:.1f}",
                         **({"note": f"the main job's gradient bucket: {MAIN_JOB_STEPS:,} steps cost "
                                     f"{MAIN_JOB_STEPS * gloo / 1000:.1f} s with gloo, "
                                     f"{MAIN_JOB_STEPS * shm / 1000:.1f} s with the op"}
                            if size == MAIN_JOB_GRADIENT else {})})
        rec.table(f"one all-reduce on 2 CPU ranks, median of {a.repeats}, 1 thread each", rows)
        saved = MAIN_JOB_STEPS * (times[MAIN_JOB_GRADIENT]["gloo"]
                                  - times[MAIN_JOB_GRADIENT]["DeepSpeed shared-memory op"]) / 1000
        rec.headline("the op's gain over gloo across the main job's 1,600 gradient all-reduces", f"{saved:.1f} s")
        if built is not None:
            rec.headline("building the op in a new environment (the first pretraining paid it)", f"{built:.0f} s")


if __name__ == "__main__":
    main()
