"""Notebook setup and small plotting helpers shared by every lesson.

Each lesson's first cell is::

    from posenc_lib.course.notebook import setup
    setup(seed=0)

which seeds everything (:func:`posenc_lib.set_seed`), pins torch to the cores a
laptop has, silences progress bars and warnings that would otherwise land in
the notebook's stderr, and sets one plotting style (perceptually uniform
colour maps, readable sizes).
"""
from __future__ import annotations

import numbers
import os
import warnings

from ..utils import available_cores

#: torch threads of a lesson that does not ask for a count (fewer on a machine with fewer cores)
DEFAULT_THREADS = 2


def _thread_count(threads) -> int | None:
    """The torch thread count for ``setup(threads=...)``; see :func:`setup`."""
    if threads is None:
        return None
    cores = available_cores()
    if isinstance(threads, str) and threads == "auto":
        return min(DEFAULT_THREADS, cores)
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise TypeError(f"threads must be an integer >= 1, 'auto' or None, got {threads!r} ({type(threads).__name__})")
    if threads < 1:
        raise ValueError(f"threads must be an integer >= 1, 'auto' or None, got {threads!r}")
    if threads > cores:
        warnings.warn(f"setup(threads={threads}) asks for more threads than the {cores} available core(s); "
                      f"using {cores}", stacklevel=3)  # fmt: skip
        return cores
    return int(threads)


def setup(seed: int = 0, threads: int | str | None = "auto") -> None:
    """Seed, quiet and style a notebook session. Safe to call more than once.

    ``threads``: torch's CPU thread count.  ``"auto"`` (the default) uses
    :data:`DEFAULT_THREADS`, or every core if there are fewer; an integer >= 1 asks
    for that many, and more than the available cores warns and uses the cores;
    ``None`` leaves torch's setting alone.
    """
    n_threads = _thread_count(threads)  # before anything changes: a bad value leaves the session as it was
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*IProgress not found.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import matplotlib
    import matplotlib.pyplot as plt
    import torch

    from ..utils import set_seed

    if n_threads is not None:
        torch.set_num_threads(n_threads)
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
