"""The one precision vocabulary of pretraining, fine-tuning and the Kit (`fp32 | bf16 | fp16`), and whether this CPU
computes bf16 natively, with the up-front warning when a config asks for bf16 on one that does not.

Without native bf16 (x86 `avx512_bf16` / `amx_bf16`, Arm `bf16`) every bf16 matmul is emulated:
a MiniLM-sized BERT with `configs/bert-base.json`'s bf16 took 97 s per step on AVX2 cores, against
a few seconds in fp32 (measured on this project's 2-core machine). The pipeline warns before anything loads
rather than switching to fp32 itself: the config stays the one record of the run's precision, so
a checkpoint resumed on another machine, the MLflow parameters and a rerun all see the precision
that was asked for. The warning names the override that switches to fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def accelerate_precision(precision: Precision) -> str:
    """accelerate's name for a precision (it calls fp32 "no")."""
    return "no" if precision == "fp32" else precision


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 AVX-512 / AMX, Arm (FEAT_BF16)


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of /proc/cpuinfo's text (`flags` on x86, `Features` on Arm)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has bf16 instructions; `cpuinfo` is /proc/cpuinfo's text (read when None).

    Where there is no /proc/cpuinfo (macOS), oneDNN's own answer stands in.
    """
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.exists():
            import torch

            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        cpuinfo = path.read_text(errors="replace")
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def bf16_cpu_warning(bf16: bool, cuda: bool, native: bool, override: str) -> str | None:
    """The warning for a bf16 run on a CPU without native bf16, else None. `override` turns bf16 off."""
    if not bf16 or cuda or native:
        return None
    return ("warning: this config trains in bf16, but this CPU has no native bf16 (no avx512_bf16, amx_bf16 or "
            "bf16 flag in /proc/cpuinfo): every bf16 matmul is emulated, measured about 30x slower than fp32 "
            f"(97 s per step for a MiniLM-sized BERT). Train in fp32 here with {override}")
