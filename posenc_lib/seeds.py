"""Seeds: :func:`set_seed`, the one place where random, numpy and torch are seeded, and the seeds a command line
accepts (:data:`MAX_SEED`, :func:`parse_seed_list`)."""
from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every GPU).

    Every notebook calls this in its first cell, every experiment once per run.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must lie in [-2**63, 2**64 - 1] (what torch accepts), got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


#: the seeds a command line accepts: NumPy's and torch's common range (``set_seed`` refuses larger ones)
MAX_SEED = 2**32 - 1


def parse_seed_list(text: str, flag: str = "--seeds") -> list[int]:
    """``--seeds``: comma-separated integers in ``[0, MAX_SEED]``, at least one, in order without repeats.

    Every item is checked before any work; a ``ValueError`` names the bad item (and the whole list when
    there are more) and the valid range.
    """
    seeds = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            seed = int(item)
        except ValueError:
            raise ValueError(f"{flag} must be comma-separated integers, got {text!r}"
                             + (f" ({item.strip()!r} is not an integer" if item.strip() != text else " (not an integer")
                             + f"; valid seeds: 0 to {MAX_SEED})") from None  # fmt: skip
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"{flag} must be integers from 0 to {MAX_SEED}, got {seed}")
        seeds.append(seed)
    if not seeds:
        raise ValueError(f"{flag} must name at least one integer seed from 0 to {MAX_SEED}, got {text!r}")
    return list(dict.fromkeys(seeds))
