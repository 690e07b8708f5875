"""What an attention call is given: checks of its arguments (dtypes, shapes and types only, so no device
synchronisation) and the one boolean mask that causality and padding combine into."""
from __future__ import annotations

import torch

from ..checks import check_bool, check_int_range, check_position_tensor


def check_positions(q_pos, k_pos) -> None:
    """The positions a scheme's ``prepare`` takes: 1-D integer tensors (dtype and shape only, no device read)."""
    check_position_tensor("q_pos", q_pos, integer=True)
    check_position_tensor("k_pos", k_pos, integer=True)


def check_attention_call(d_model: int, x, kv, key_padding_mask, causal, need_weights, layer,
                         num_layers: int | None) -> None:
    """The arguments of an attention call: dtypes, shapes and types only (no value is read, so no device sync)."""
    for name, t in (("x", x), ("kv", kv)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (batch, length, d_model), got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.ndim != 3 or t.shape[2] != d_model or (t is kv and t.shape[0] != x.shape[0]):
            batch = "batch" if t is x else f"batch={x.shape[0]}"  # formatted here only: a compiled call keeps it symbolic
            raise ValueError(f"{name} must have shape ({batch}, length, d_model={d_model}), "
                             f"got {tuple(t.shape)}")  # fmt: skip
    if key_padding_mask is not None:
        mask = key_padding_mask
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise TypeError(f"key_padding_mask must be a bool tensor (True at padding) or None, got {got}")
        keys = tuple((x if kv is None else kv).shape[:2])
        if tuple(mask.shape) != keys:
            raise ValueError(f"key_padding_mask must have shape (batch, length) = {keys}, got {tuple(mask.shape)}: "
                             "one entry per key")  # fmt: skip
    check_bool("causal", causal)
    check_bool("need_weights", need_weights)
    last = num_layers - 1 if num_layers is not None else None
    if type(layer) is not int or layer < 0 or (last is not None and layer > last):
        check_int_range("layer", layer, 0, last)  # the index among the scheme's num_layers layers


def merge_masks(
    q_len: int,
    k_len: int,
    *,
    causal: bool,
    q_pos: torch.Tensor | None,
    k_pos: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
) -> torch.Tensor | None:
    """Boolean ``allowed`` mask broadcastable to ``(batch, 1, q_len, k_len)``, or ``None``.

    ``key_padding_mask: (batch, k_len)`` is True at padding (the PyTorch convention).
    The causal part compares absolute positions, so it is right for cached steps too.
    """
    allowed = None
    if causal:
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if key_padding_mask is not None:
        keep = ~key_padding_mask.bool()[:, None, None, :]
        if q_pos is not None and k_pos is not None:
            # self-attention: a (padding) query may always see itself, so that no row is fully
            # masked (a fully masked row gives NaN, and NaN * 0 poisons the layers after it)
            keep = keep | (k_pos[None, :] == q_pos[:, None])[None, None]
        allowed = keep if allowed is None else (allowed & keep)
    return allowed
