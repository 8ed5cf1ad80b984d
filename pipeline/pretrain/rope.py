"""ModernBERT's rotary bases changed in place: a context-extension phase raises them (10k → 160k in ModernBERT).

transformers 5 computes each layer type's non-persistent `<layer type>_inv_freq` buffer (and its
`_original_` copy) once, from `config.rope_parameters`, so changing the config alone changes nothing:
the buffers are recomputed here with the module's own init function, so the model and its config
(which the checkpoint marker and the export record) carry the same bases. The buffers are not saved
in checkpoints; a resumed run rebuilds them from its phase.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pipeline.pretrain.phases import Phase

# ModernBertConfig's layer types: the global layers attend fully, the local ones in a sliding window.
LAYER_TYPE_OF = {"global": "full_attention", "local": "sliding_attention"}


def rope_thetas(model: torch.nn.Module) -> dict[str, float]:
    """The config's rotary bases, as {"global": θ, "local": θ}."""
    parameters = model.config.rope_parameters
    return {kind: float(parameters[layer_type]["rope_theta"]) for kind, layer_type in LAYER_TYPE_OF.items()}


@torch.no_grad()
def set_rope_theta(model: torch.nn.Module, global_theta: float, local_theta: float) -> bool:
    """Give a ModernBERT model (or an engine's module) these rotary bases: config and inverse frequencies.

    Returns whether anything changed.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding

    rotary = next((m for m in model.modules() if isinstance(m, ModernBertRotaryEmbedding)), None)
    if rotary is None:
        raise ValueError(f"{type(model).__name__} has no ModernBERT rotary embedding to set a RoPE theta on")
    wanted = {"global": float(global_theta), "local": float(local_theta)}
    if rope_thetas(model) == wanted:
        return False
    config = model.config
    for kind, layer_type in LAYER_TYPE_OF.items():
        config.rope_parameters[layer_type]["rope_theta"] = wanted[kind]
    for layer_type in rotary.layer_types:
        init = rotary.compute_default_rope_parameters
        if rotary.rope_type[layer_type] != "default":
            init = ROPE_INIT_FUNCTIONS[rotary.rope_type[layer_type]]
        inv_freq, scaling = init(rotary.config, layer_type=layer_type)
        buffer = getattr(rotary, f"{layer_type}_inv_freq")
        buffer.copy_(inv_freq.to(buffer.device, buffer.dtype))
        getattr(rotary, f"{layer_type}_original_inv_freq").copy_(inv_freq.to(buffer.device, buffer.dtype))
        setattr(rotary, f"{layer_type}_attention_scaling", scaling)
    return True


def use_phase_rope(model: torch.nn.Module, phase: Phase, say: Callable[[str], None]) -> None:
    """A ModernBERT phase's rotary bases on `model` (other architectures' phases have none), said when they change."""
    if phase.global_rope_theta is not None and set_rope_theta(model, phase.global_rope_theta, phase.local_rope_theta):
        say(f"RoPE theta: global {phase.global_rope_theta:g}, local {phase.local_rope_theta:g}")
