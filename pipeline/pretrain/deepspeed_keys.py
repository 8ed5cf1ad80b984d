"""What the config knows of DeepSpeed's keys: the `deepspeed` section's further keys checked against DeepSpeed's models.

The pipeline owns precision, the ZeRO stage, batch sizes, optimizer, schedule and clipping; the section
may not set them (an old spelling is refused with the new one). Everything else passes to DeepSpeed as
given, after two checks it does not make itself: a top-level key it never reads (a typo such as
`zero_optimisation`, which it would ignore silently) is an error naming it, and the sections it models
with pydantic (`zero_optimization`, `bf16`, `fp16`) are validated by those models, which forbid
unknown keys. DeepSpeed is imported only when the section holds something (`import deepspeed` takes seconds).
"""

from __future__ import annotations

import difflib
import importlib
from functools import cache
from typing import Any

# Keys of the deepspeed section that the pipeline derives itself, and where to set them instead.
DERIVED_DEEPSPEED_KEYS = {
    "train_batch_size": "train.global_batch_size",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size and train.micro_batch_size (it is derived)",
    "optimizer": "the optimizer section",
    "scheduler": "the schedule section",
    "gradient_clipping": "train.gradient_clipping",
    "torch_autocast": "train.precision (at ZeRO 0, bf16 and fp16 train under autocast: step/engine.py)",
}

# Modules whose upper-case string constants name DeepSpeed's config keys (those a version lacks are skipped).
_KEY_MODULES = ("deepspeed.runtime.constants", "deepspeed.runtime.zero.config",
                "deepspeed.runtime.activation_checkpointing.config", "deepspeed.profiling.constants",
                "deepspeed.comm.constants", "deepspeed.runtime.data_pipeline.constants",
                "deepspeed.runtime.swap_tensor.constants", "deepspeed.autotuning.constants")
# Top-level keys DeepSpeedConfig reads under a literal rather than a constant of those modules.
_LITERAL_KEYS = frozenset({"tensorboard", "wandb", "csv_monitor", "comet", "hybrid_engine", "compile", "timers",
                           "weight_quantization", "torch_autocast", "pipeline"})


@cache
def deepspeed_top_level_keys() -> frozenset[str]:
    """The key names DeepSpeed's config knows (a superset of its top-level keys)."""
    keys = set(_LITERAL_KEYS)
    for name in _KEY_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a module this DeepSpeed version lacks
            continue
        keys |= {value for key, value in vars(module).items()
                 if key.isupper() and isinstance(value, str) and value.islower() and value.replace("_", "").isalnum()}
    return frozenset(keys)


def owned_key_problems(ds: dict[str, Any]) -> list[str]:
    """Keys of the section that the pipeline owns, each with where to set it now."""
    problems = [f"deepspeed.{key}: derived by the pipeline; set {where}"
                for key, where in DERIVED_DEEPSPEED_KEYS.items() if key in ds]
    for name in ("bf16", "fp16"):
        section = ds.get(name)
        if isinstance(section, dict) and "enabled" in section:
            problems.append(f"deepspeed.{name}.enabled: precision is a typed key now; write train.precision: "
                            f"\"{name}\" (or \"fp32\") and leave deepspeed.{name} for DeepSpeed's further {name} keys")
    zero = ds.get("zero_optimization")
    if isinstance(zero, dict) and "stage" in zero:
        problems.append(f"deepspeed.zero_optimization.stage: the ZeRO stage is a typed key now; write "
                        f"train.zero_stage: {zero['stage']!r} and leave deepspeed.zero_optimization for "
                        "DeepSpeed's further ZeRO keys")
    return problems


GRAD_SCALER_KEYS = ("initial_scale_power", "loss_scale_window")
"""The `fp16` keys torch's GradScaler takes at ZeRO 0 (pipeline/pretrain/step/deepspeed_patches.py builds it
from them)."""


def grad_scaler_problems(ds: dict[str, Any], precision: str, zero_stage: int) -> list[str]:
    """fp16 keys that nothing would apply: at ZeRO 0 fp16 scales the loss with torch's GradScaler, not DeepSpeed's."""
    section = ds.get("fp16")
    if precision != "fp16" or zero_stage != 0 or not isinstance(section, dict):
        return []
    return [f"deepspeed.fp16.{key}: not applied at ZeRO 0, where fp16 scales the loss with torch's GradScaler, which "
            f"takes {' and '.join(GRAD_SCALER_KEYS)}; leave it out, or use train.zero_stage ≥ 1 for DeepSpeed's own "
            "loss scaling" for key, value in section.items()
            if key not in (*GRAD_SCALER_KEYS, "enabled") and not (key == "loss_scale" and value == 0)]


COMMUNICATION_DATA_TYPES = ("fp32", "bf16", "fp16")
"""`communication_data_type`'s values: what gradients travel in between ranks (DeepSpeed's spelling, any case)."""


def communication_problems(ds: dict[str, Any]) -> list[str]:
    """The keys of how gradients are averaged over the ranks, checked before a launch: DeepSpeed applies them at
    ZeRO 1-3, and ZeRO 0's all-reduce (pipeline/pretrain/step/gradient_buckets.py) applies them as DeepSpeed would.
    DeepSpeed checks `communication_data_type` only when it builds the engine, the others not at all."""
    problems = []
    dtype = ds.get("communication_data_type")
    if dtype is not None and not (isinstance(dtype, str) and dtype.lower() in COMMUNICATION_DATA_TYPES):
        problems.append(f"deepspeed.communication_data_type: expected one of {', '.join(COMMUNICATION_DATA_TYPES)} "
                        f"(what gradients travel in between ranks), got {dtype!r}")
    factor = ds.get("gradient_predivide_factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not 0 < factor < float("inf")):
        problems.append(f"deepspeed.gradient_predivide_factor: expected a positive number (gradients are divided by "
                        f"it before the sum over the ranks, and the sum by world size / it), got {factor!r}")
    prescale = ds.get("prescale_gradients")
    if prescale is not None and not isinstance(prescale, bool):
        problems.append(f"deepspeed.prescale_gradients: expected true or false, got {prescale!r}")
    elif prescale and factor is not None:
        problems.append("deepspeed.gradient_predivide_factor: not applied with deepspeed.prescale_gradients true, "
                        "which divides by the world size before the sum; leave one of them out")
    return problems


def offloads_optimizer(ds: dict[str, Any]) -> bool:
    """True when the section moves the optimizer's states off the device (`zero_optimization.offload_optimizer`)."""
    zero = ds.get("zero_optimization")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    return (offload if isinstance(offload, dict) else {}).get("device", "none") not in ("none", None)


def deepspeed_key_problems(ds: dict[str, Any]) -> list[str]:
    """Unknown top-level keys and sections that DeepSpeed's own pydantic models refuse."""
    if not ds:
        return []
    import pydantic
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    known = deepspeed_top_level_keys()
    problems = []
    for key in ds:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"deepspeed.{key}: not a DeepSpeed config key{hint}; DeepSpeed would ignore it")
    models = {"zero_optimization": DeepSpeedZeroConfig, "bf16": DeepSpeedBF16Config, "fp16": DeepSpeedFP16Config}
    for name, model in models.items():
        section = ds.get(name)
        if section is not None and not isinstance(section, dict):
            problems.append(f"deepspeed.{name}: expected an object, got {section!r}")
        elif section is not None:
            try:
                model(**section)
            except pydantic.ValidationError as err:
                problems += [f"deepspeed.{name}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()]
            except (TypeError, ValueError) as err:
                problems.append(f"deepspeed.{name}: {err}")
    return problems
