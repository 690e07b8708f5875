"""Notebook setup and small plotting helpers shared by every lesson.

Each lesson's first cell is::

    from posenc_lib.notebook import setup
    setup(seed=0)

which seeds everything (:func:`posenc_lib.set_seed`), pins torch to the cores a
laptop has, silences progress bars and warnings that would otherwise land in
the notebook's stderr, and sets one plotting style (perceptually uniform
colour maps, readable sizes).
"""
from __future__ import annotations

import os
import warnings


def setup(seed: int = 0, threads: int | None = 2) -> None:
    """Seed, quiet and style a notebook session. Safe to call more than once."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*IProgress not found.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import matplotlib
    import matplotlib.pyplot as plt
    import torch

    from .utils import set_seed

    if threads is not None:
        torch.set_num_threads(max(1, min(threads, os.cpu_count() or 1)))
    set_seed(seed)
    matplotlib.rcParams.update(
        {
            "image.cmap": "viridis",
            "figure.dpi": 90,
            "figure.figsize": (6.4, 4.0),
            "axes.grid": False,
            "font.size": 10,
        }
    )
    plt.close("all")


def heatmap(ax, matrix, *, title: str, xlabel: str, ylabel: str, cmap: str = "viridis", colorbar: str | None = None,
            **kwargs):
    """Draw ``matrix`` (tensor or array) on ``ax`` with labels and an optional labelled colour bar."""
    import numpy as np

    m = matrix.detach().cpu().numpy() if hasattr(matrix, "detach") else np.asarray(matrix)
    im = ax.imshow(m, cmap=cmap, aspect="auto", interpolation="nearest", **kwargs)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if colorbar is not None:
        ax.figure.colorbar(im, ax=ax, label=colorbar)
    return im
