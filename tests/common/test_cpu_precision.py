"""bf16 on a CPU without native bf16 is flagged before anything loads; the CPU's answer is injected here."""

from __future__ import annotations

import json

from helpers import run_script

from pipeline.models.precision import bf16_cpu_warning, cpu_flags, native_bf16

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
NEOVERSE_V1 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_flags(AVX2_ONLY) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert not native_bf16(AVX2_ONLY)
    assert native_bf16(SAPPHIRE_RAPIDS)
    assert native_bf16(NEOVERSE_V1)


def test_bf16_without_native_support_warns_naming_the_fp32_override():
    message = bf16_cpu_warning(True, cuda=False, native=False, override="--set train.precision=fp32")
    assert "no native bf16" in message and message.endswith("--set train.precision=fp32")


def test_no_warning_with_native_bf16_on_a_gpu_or_in_fp32():
    assert bf16_cpu_warning(True, cuda=False, native=True, override="x") is None
    assert bf16_cpu_warning(True, cuda=True, native=False, override="x") is None
    assert bf16_cpu_warning(False, cuda=False, native=False, override="x") is None


def test_the_pretraining_launcher_warns_before_training(tmp_path, roberta_shards, bpe_tokenizer_dir):
    """--print-config stops after the checks; the warning (on this CPU's answer) comes before any of it."""
    from helpers import tiny_pretrain_config

    config = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out",
                                  train={"precision": "bf16"})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    proc = run_script("launchers/pretrain.py", "--config", path, "--print-config", check=True)
    assert ("no native bf16" in proc.stderr) == (not native_bf16())
