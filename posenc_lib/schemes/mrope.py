"""Multimodal RoPE (M-RoPE): one rotation per token from three position ids, time, height and width.

Lesson 11's axial RoPE rotates half of each head by a patch's row and half by its column.  Qwen2-VL
(Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any
Resolution", arXiv:2409.12191) grows it into a position scheme for a sequence that mixes text and images:

* every token gets three ids ``(t, h, w)``.  A text token at position ``p`` gets ``(p, p, p)`` -- then the
  rotation is exactly plain 1-D RoPE; an image of ``H x W`` patches (after merging) starting at ``s`` gets
  ``(s, s + row, s + col)``; the text after it restarts at ``s + max(H, W)``;
* the ``d / 2`` rotation pairs are shared out between the three axes by ``sections = (s_t, s_h, s_w)``
  (``s_t + s_h + s_w = d / 2``), and pair ``k`` turns by ``id_{axis(k)} * theta_k``:

  - **chunked** (Qwen2-VL, Qwen2.5-VL): the first ``s_t`` pairs read ``t``, the next ``s_h`` read ``h``,
    the last ``s_w`` read ``w``.  Time gets only the fast frequencies, width only the slow ones;
  - **interleaved** (Qwen3-VL): pairs cycle ``t, h, w, t, h, w, ...`` (pair ``k`` reads ``h`` if
    ``k % 3 == 1`` and ``k < 3 s_h``, ``w`` if ``k % 3 == 2`` and ``k < 3 s_w``, else ``t``), so every axis
    spans the whole range of speeds.

Both use the half-split pairing (``rotate_half``); a query-key score then depends on the three
differences ``(t_j - t_i, h_j - h_i, w_j - w_i)`` only, as lesson 06's does on ``n - m``.

Taught in notebooks/15_rope_in_llms.ipynb (section 5).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .rotary import apply_rope_cos_sin, rope_frequencies
from ..checks import check_even, check_positive_int

__all__ = ["MROPE_LAYOUTS", "mrope_position_ids", "mrope_axes", "mrope_cos_sin", "apply_mrope"]

#: how the pairs are shared out between t, h and w
MROPE_LAYOUTS = ("chunked", "interleaved")


def mrope_position_ids(segments: Sequence[tuple[str, object]]) -> torch.Tensor:
    """``(3, N)`` long ids ``(t, h, w)`` for a sequence of ``("text", n)`` and ``("image", (H, W))`` segments.

    ``(H, W)``: the image's grid of tokens after the vision encoder's patch merging.  Text continues one
    past the largest id so far (Qwen2-VL's rule for images).
    """
    ids, start = [], 0
    for i, seg in enumerate(segments):
        if not (isinstance(seg, (tuple, list)) and len(seg) == 2 and seg[0] in ("text", "image")):
            raise ValueError(f"segment {i} must be ('text', n) or ('image', (H, W)), got {seg!r}")
        kind, size = seg
        if kind == "text":
            n = check_positive_int(f"segment {i} length", size)
            ids.append(torch.arange(start, start + n).expand(3, n))
            start += n
        else:
            if not (isinstance(size, (tuple, list)) and len(size) == 2):
                raise ValueError(f"segment {i}: an image's size is (H, W) tokens, got {size!r}")
            h, w = (check_positive_int(f"segment {i} {a}", v) for a, v in zip(("H", "W"), size))
            rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            ids.append(torch.stack((torch.full((h * w,), start), start + rows.flatten(), start + cols.flatten())))
            start += max(h, w)
    if not ids:
        raise ValueError("segments is empty")
    return torch.cat(ids, dim=1)


def mrope_axes(head_dim: int, sections: Sequence[int], layout: str = "chunked") -> torch.Tensor:
    """``(head_dim // 2,)`` long: which id (0 = t, 1 = h, 2 = w) each rotation pair reads."""
    head_dim = check_even("head_dim", head_dim)
    if layout not in MROPE_LAYOUTS:
        raise ValueError(f"unknown M-RoPE layout {layout!r}; valid layouts: {', '.join(MROPE_LAYOUTS)}")
    if len(sections) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sections) \
            or sum(sections) != head_dim // 2:  # fmt: skip
        raise ValueError(f"sections must be three integers >= 0 (pairs for t, h, w) summing to head_dim // 2 = "
                         f"{head_dim // 2}, got {list(sections)}")  # fmt: skip
    if layout == "chunked":
        return torch.cat([torch.full((s,), a) for a, s in enumerate(sections)])
    k = torch.arange(head_dim // 2)
    axes = torch.zeros(head_dim // 2, dtype=torch.long)
    axes[(k % 3 == 1) & (k < 3 * sections[1])] = 1
    axes[(k % 3 == 2) & (k < 3 * sections[2])] = 2
    return axes


def mrope_cos_sin(position_ids: torch.Tensor, head_dim: int, sections: Sequence[int], base: float = 10000.0,
                  layout: str = "chunked") -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """cos and sin ``(N, head_dim)`` float32 (half-split layout) for ``position_ids (3, N)``."""
    if position_ids.dim() != 2 or position_ids.shape[0] != 3:
        raise ValueError(f"position_ids must be (3, N): t, h, w per token; got shape {tuple(position_ids.shape)}")
    axes = mrope_axes(head_dim, sections, layout).to(position_ids.device)
    theta = rope_frequencies(head_dim, base, position_ids.device)
    ids = position_ids.to(torch.float32)[axes]  # (head_dim // 2, N): each pair's own id
    ang = ids.t() * theta
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def apply_mrope(x: torch.Tensor, position_ids: torch.Tensor, sections: Sequence[int], base: float = 10000.0,
                layout: str = "chunked") -> torch.Tensor:  # fmt: skip
    """Rotate ``x (..., N, head_dim)`` by the ids ``position_ids (3, N)`` (half-split pairing)."""
    if position_ids.dim() != 2 or position_ids.shape[-1] != x.shape[-2]:
        raise ValueError(f"position_ids must be (3, N) with N = x.shape[-2] = {x.shape[-2]}, "
                         f"got shape {tuple(position_ids.shape)}")  # fmt: skip
    cos, sin = mrope_cos_sin(position_ids, x.shape[-1], sections, base, layout)
    return apply_rope_cos_sin(x, cos, sin, interleaved=False)
