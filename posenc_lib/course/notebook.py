"""Notebook setup and small plotting helpers shared by every lesson.

Each lesson's first cell is::

    from posenc_lib.course.notebook import setup
    setup(seed=0)

which seeds everything (:func:`posenc_lib.set_seed`), pins torch to the cores a
laptop has, silences progress bars and warnings that would otherwise land in
the notebook's stderr, and sets one plotting style (perceptually uniform
colour maps, readable sizes).

A lesson that shows committed results reads them through :func:`results_file` (or
:func:`results_files`): a file that is not there yet is one line naming it and the command that
makes it, not a ``FileNotFoundError`` from deep inside ``json``.
"""
from __future__ import annotations

import numbers
import os
import warnings
from pathlib import Path

from ..pool import available_cores

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

    from ..seeds import set_seed

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


#: the command that makes each committed results folder or file (repository-relative), for :func:`results_file`;
#: None for a committed record of an earlier measurement, which no command of today makes again
RESULT_COMMANDS = {
    "results/extrapolation": "python -m posenc_lib.experiments.extrapolation --profile pilot --pe all --seeds 0,1,2 "
                             "--out results/extrapolation --jobs 2",
    "results/extrapolation_course/encdec": "python -m posenc_lib.experiments.extrapolation --profile course --arch "
                                           "encdec --pe all --seeds 0,1,2 --out results/extrapolation_course/encdec "
                                           "--jobs 2",
    "results/extrapolation_course/decoder": "python -m posenc_lib.experiments.extrapolation --profile course --arch "
                                            "decoder --pe all --seeds 0,1,2 --out "
                                            "results/extrapolation_course/decoder --jobs 2",
    "results/extrapolation_course/unanchored/encdec": "python -m posenc_lib.experiments.extrapolation --profile course "
                                                      "--arch encdec --unanchored --pe all --seeds 0 --out "
                                                      "results/extrapolation_course/unanchored/encdec --jobs 2",
    "results/extrapolation_course/lr_sweep": "python -m posenc_lib.experiments.extrapolation --profile course --arch "
                                             "ARCH --lr LR --pe none,learned-rand,sinusoidal-rand,rope-rand,alibi "
                                             "--seeds 0 --out results/extrapolation_course/lr_sweep/ARCH_lrLR for ARCH "
                                             "encdec (without alibi) and decoder, LR 1e-3 and 4e-3",
    "results/extrapolation_budget": "bash scripts/extrapolation_budget.sh (both architectures, in rounds: reversal "
                                    "seed k, then copying seed k; seeds 0-4 of each; run it again to resume)",
    "results/extrapolation_budget_16000": "bash scripts/extrapolation_budget_16000.sh (decoder-only reversal, every "
                                          "scheme, seeds 0-4, 16000 updates; one seed at a time; run it again to "
                                          "resume)",
    "results/extrapolation_budget_4000": None,  # the first try at sizing the budget profile (4000 updates)
    "results/extrapolation_budget_12000": "python -m posenc_lib.experiments.extrapolation --profile budget --task "
                                          "reverse --arch decoder --steps 12000 --pe none,deberta,t5-wide --seeds 1 "
                                          "--out results/extrapolation_budget_12000 --jobs 2",
    "results/extrapolation_budget_12000_none": "python -m posenc_lib.experiments.extrapolation --profile budget "
                                               "--task reverse --arch decoder --steps 12000 --pe none --seeds 2,3 "
                                               "--out results/extrapolation_budget_12000_none --jobs 2",
    "results/passkey_trained": "python -m posenc_lib.experiments.passkey_trained --profile course --seeds 0,1,2,3,4 "
                               "--out results/passkey_trained --jobs 2",
    "results/passkey_long": "python -m posenc_lib.experiments.passkey_long --profile course --seeds 0,1,4 --out "
                            "results/passkey_long --ckpt runs/passkey-long --reference results/passkey_trained "
                            "--jobs 2",
    "results/long_context": "python -m posenc_lib.experiments.long_context --profile course --seeds 0,1,2 --out "
                            "results/long_context --jobs 2 --resume",
    "results/long_context_scaled": "python -m posenc_lib.experiments.long_context_scaled --profile course --seeds "
                                   "0,1,2 --trials 100 --out results/long_context_scaled",
    "results/sliding_window": "python -m posenc_lib.experiments.sliding_window --profile course --seeds 0,1,2 "
                              "--models alibi,rope,nope --out results/sliding_window",
    "results/long_context_extra": "python -m posenc_lib.experiments.long_context_extra --out "
                                  "results/long_context_extra",
    "results/rope_variants": "python -m posenc_lib.experiments.rope_variants --profile course --seeds 0,1,2 --out "
                             "results/rope_variants --jobs 2",
    "results/rope_variants/timing.json": "python -m posenc_lib.experiments.rope_variants --profile course "
                                         "--time-updates 20 --timing-out results/rope_variants/timing.json",
    "results/cope_counting": "python -m posenc_lib.experiments.cope_counting --profile course --seeds 0,1,2 --out "
                             "results/cope_counting --jobs 2",
    "results/inside": "python -m posenc_lib.experiments.inside --profile course --seeds 0,1,2 --out results/inside "
                      "--jobs 2 --resume",
    "results/inside/timing.json": "python -m posenc_lib.experiments.inside --profile course --time-updates 20 "
                                  "--timing-out results/inside/timing.json",
    "results/inside/bands": "python -m posenc_lib.experiments.inside --profile course --bands --seeds 0,1,2 --out "
                            "results/inside/bands",
    "results/inside/decay": "python -m posenc_lib.experiments.inside --profile course --decay --seeds 0,1,2 --out "
                            "results/inside/decay",
    "results/inside/cache_controls": "python -m posenc_lib.experiments.inside --profile course --cache-controls --models "
                                     "nope --seeds 0,1,2 --out results/inside/cache_controls",
    "results/wmt14-laptop": "python -m posenc_lib.experiments.wmt14 --profile laptop --pe none,sinusoidal,shaw,rope "
                            "--seeds 0,1,2 --jobs 2 --threads 1 --out results/wmt14-laptop --resume, then the same "
                            "with --pe learned,t5,xlnet,deberta,alibi --seeds 0,1,2 and with --pe alibi-directional "
                            "--seeds 0,1",
    "results/wmt14-laptop-precision": "python -m posenc_lib.experiments.wmt14 --profile laptop --pe shaw,rope --seeds 2 "
                                      "--jobs 2 --threads 1 --out results/wmt14-laptop-precision --resume (bf16, the "
                                      "profile's precision; the same models of results/wmt14-laptop trained in fp32), "
                                      "then python -m posenc_lib.experiments.wmt14.report precision results/wmt14-laptop "
                                      "results/wmt14-laptop-precision",
    "results/wmt14-gpu-short": "SOURCE=files SEEDS=0 RUN_DIR=results/wmt14-gpu-short bash scripts/gpu_finale.sh start 4 "
                               "(on one H200 GPU; the calibration fits max_steps to the 4-minute budget)",
    "results/wmt14-gpu-500": "SOURCE=files SEEDS=0 PES=none,sinusoidal,rope JOBS=3 RUN_DIR=results/wmt14-gpu-500 bash "
                             "scripts/gpu_finale.sh start 7 (on one H200 GPU; the calibration fits 500 updates to the "
                             "7-minute budget), then shaw with: python -m posenc_lib.experiments.wmt14 --profile gpu "
                             "--pe none,sinusoidal,shaw,rope --seeds 0 --source files --out results/wmt14-gpu-500 "
                             "--jobs 3 --resume --set max_steps=500 --set warmup=125; seed 1 with the same command "
                             "and --seeds 1",
    "benchmarks/results": "python -m benchmarks.run --out benchmarks/results --overwrite",
    "benchmarks/results/batches": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,deberta "
                                  "--lengths 512,1024 --batches 1,2,8,16 --repeats 3 --out benchmarks/results/batches, "
                                  "then python -m benchmarks.run --only decode --decode-compile --decode-batch 8 "
                                  "--decode-repeats 5 --out benchmarks/results/batches (decode_second_run.json: the "
                                  "same decoding command again, its decode.json renamed)",
    "benchmarks/results/batches_epyc": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,"
                                       "deberta --lengths 512,1024 --batches 1,2,8,16 --repeats 3 --out "
                                       "benchmarks/results/batches_epyc (the batch axis again, on the AMD EPYC of the "
                                       "main run, after the fused path's backward pass was written out)",
    "benchmarks/results/batches_epyc_2": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,"
                                         "deberta --lengths 512,1024 --batches 1,2,8,16 --repeats 3 --out "
                                         "benchmarks/results/batches_epyc_2 (the batch axis on the AMD EPYC after T5's "
                                         "per-block bias, the backward pass in blocks of 256 rows and the fused path "
                                         "from 2**22 score elements)",
    "benchmarks/results/batches_epyc_2/L2048": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,"
                                               "xlnet,deberta --lengths 2048 --batches 1,2 --repeats 3 --out "
                                               "benchmarks/results/batches_epyc_2/L2048",
    "benchmarks/results/batches_epyc_2/B32": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,"
                                             "xlnet,deberta --lengths 512 --batches 32 --repeats 3 --out "
                                             "benchmarks/results/batches_epyc_2/B32",
    "benchmarks/results/alibi_offsets": "python -m benchmarks.run --only train,memory --schemes alibi --lengths "
                                        "512,1024 --batches 1,2,8,16 --repeats 3 --out benchmarks/results/alibi_offsets "
                                        "(ALiBi's grid after its bias was laid out block by block)",
    "benchmarks/results/deberta_blocks": "python -m benchmarks.run --only train,memory --schemes deberta --lengths "
                                         "512,1024 --batches 1,2,8,16 --repeats 3 --out benchmarks/results/deberta_blocks "
                                         "(DeBERTa's grid after a layer's blocks ran in one node)",
    "benchmarks/results/t5_offsets": "python -m benchmarks.run --only train,memory --schemes t5 --lengths 512,1024 "
                                     "--batches 1,2,8,16 --repeats 3 --out benchmarks/results/t5_offsets (T5's grid "
                                     "after its encoder's bias gradient was summed per diagonal block by block)",
    "benchmarks/results/t5_offsets/L2048": "python -m benchmarks.run --only train,memory --schemes t5 --lengths 2048 "
                                           "--batches 1,2 --repeats 3 --out benchmarks/results/t5_offsets/L2048",
    "benchmarks/results/xlnet_blocks": "python -m benchmarks.run --only train,memory --schemes xlnet --lengths 512,1024 "
                                       "--batches 1,2,8,16 --repeats 3 --out benchmarks/results/xlnet_blocks (XLNet's "
                                       "grid after a layer's blocks ran in one node)",
    "benchmarks/results/xlnet_blocks/L2048": "python -m benchmarks.run --only train,memory --schemes xlnet --lengths "
                                             "2048 --batches 1,2 --repeats 3 --out benchmarks/results/xlnet_blocks/L2048",
    "benchmarks/results/clipped_sides": "python -m benchmarks.run --only train,memory --schemes shaw,deberta --lengths "
                                        "512,1024 --batches 1,2,8,16 --repeats 3 --out benchmarks/results/clipped_sides "
                                        "(Shaw's and DeBERTa's grid after the keys beyond their clipping distance ran "
                                        "without a mask)",
    "benchmarks/results/clipped_sides/L2048": "python -m benchmarks.run --only train,memory --schemes shaw,deberta "
                                              "--lengths 2048 --batches 1,2 --repeats 3 --out "
                                              "benchmarks/results/clipped_sides/L2048",
    "benchmarks/results/clipped_sides/L2048_memory_again": "python -m benchmarks.run --only memory --schemes "
                                                           "shaw,deberta --lengths 2048 --batches 1,2 --repeats 3 --out "
                                                           "benchmarks/results/clipped_sides/L2048_memory_again",
    "benchmarks/results/t5_sides": "python -m benchmarks.run --only train,memory --schemes t5 --lengths 512,1024 "
                                   "--batches 1,2,8,16 --repeats 3 --out benchmarks/results/t5_sides (T5's grid after "
                                   "its keys beyond max_distance ran without a mask)",
    "benchmarks/results/t5_sides/L2048": "python -m benchmarks.run --only train,memory --schemes t5 --lengths 2048 "
                                         "--batches 1,2 --repeats 3 --out benchmarks/results/t5_sides/L2048",
    "benchmarks/results/sides_B32": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,deberta "
                                    "--lengths 1024 --batches 32 --repeats 3 --out benchmarks/results/sides_B32",
    "benchmarks/results/sides_B8_L2048": "python -m benchmarks.run --only train,memory --schemes "
                                         "t5,alibi,shaw,xlnet,deberta --lengths 2048 --batches 8 --repeats 3 --out "
                                         "benchmarks/results/sides_B8_L2048",
    "benchmarks/results/batch_chunks": "python -m benchmarks.run --only train,memory --schemes xlnet,deberta --lengths "
                                       "512,1024 --batches 16 --repeats 3 --out benchmarks/results/batch_chunks",
    "benchmarks/results/batch_chunks/B32": "python -m benchmarks.run --only train,memory --schemes xlnet,deberta "
                                           "--lengths 1024 --batches 32 --repeats 3 --out benchmarks/results/batch_chunks/B32",
    "benchmarks/results/batch_chunks/B8_L2048": "python -m benchmarks.run --only train,memory --schemes xlnet --lengths "
                                                "2048 --batches 8 --repeats 3 --out "
                                                "benchmarks/results/batch_chunks/B8_L2048",
    "benchmarks/results/batch_chunks/B16_L2048": "python -m benchmarks.run --only train,memory --schemes xlnet "
                                                 "--lengths 2048 --batches 16 --repeats 3 --out "
                                                 "benchmarks/results/batch_chunks/B16_L2048",
    "benchmarks/results/sides_B16_L2048": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,deberta "
                                          "--lengths 2048 --batches 16 --repeats 3 --out "
                                          "benchmarks/results/sides_B16_L2048",
    "benchmarks/results/fused_B1_L512": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,deberta "
                                        "--lengths 512 --batches 1 --repeats 10 --out benchmarks/results/fused_B1_L512",
    "benchmarks/results/sides_B32_L2048": "python -m benchmarks.run --only train,memory --schemes t5,alibi,shaw,xlnet,deberta "
                                          "--lengths 2048 --batches 32 --repeats 3 --out benchmarks/results/sides_B32_L2048",
    "benchmarks/results/t5_shaw_chunks": "python -m benchmarks.run --only train,memory --schemes t5,shaw --lengths 2048 "
                                         "--batches 32 --repeats 3 --out benchmarks/results/t5_shaw_chunks",
    "benchmarks/results/t5_shaw_chunks/L2048": "python -m benchmarks.run --only train,memory --schemes t5,shaw --lengths "
                                               "2048 --batches 8,16 --repeats 3 --out benchmarks/results/t5_shaw_chunks/L2048",
    "benchmarks/results/t5_shaw_chunks/L512_1024": "python -m benchmarks.run --only train,memory --schemes t5,shaw "
                                                   "--lengths 512,1024 --batches 8,16,32 --repeats 3 --out "
                                                   "benchmarks/results/t5_shaw_chunks/L512_1024",
    "benchmarks/results/xlnet_terms": "python -m benchmarks.run --only train,memory --schemes xlnet --lengths 2048 "
                                      "--batches 1,2,8,16 --repeats 3 --out benchmarks/results/xlnet_terms",
    "benchmarks/results/xlnet_terms/B32": "python -m benchmarks.run --only train,memory --schemes xlnet --lengths "
                                          "2048 --batches 32 --repeats 3 --out benchmarks/results/xlnet_terms/B32",
    "benchmarks/results/deberta_L2048": "python -m benchmarks.run --only train,memory --schemes deberta --lengths 2048 "
                                        "--batches 1,2 --repeats 5 --out benchmarks/results/deberta_L2048",
    "benchmarks/results/deberta_L2048/memory_again": "python -m benchmarks.run --only memory --schemes deberta --lengths "
                                                     "2048 --batches 1 --out benchmarks/results/deberta_L2048/memory_again",
    "benchmarks/results/deberta_L2048/memory_again_2": "python -m benchmarks.run --only memory --schemes deberta --lengths "
                                                       "2048 --batches 1 --out "
                                                       "benchmarks/results/deberta_L2048/memory_again_2",
    "benchmarks/results/b1_L2048": "python -m benchmarks.run --only train,memory --schemes t5,alibi --lengths 2048 "
                                   "--batches 1 --repeats 9 --out benchmarks/results/b1_L2048",
    "benchmarks/results/b1_L2048/again": "python -m benchmarks.run --only train,memory --schemes t5,alibi --lengths "
                                         "2048 --batches 1 --repeats 9 --out benchmarks/results/b1_L2048/again",
    "benchmarks/results/b1_L2048/again_2": "python -m benchmarks.run --only train,memory --schemes t5,alibi --lengths "
                                           "2048 --batches 1 --repeats 9 --out benchmarks/results/b1_L2048/again_2",
    "benchmarks/results/t5_encoder_B1": "python -m benchmarks.run --only train,memory --schemes t5 --lengths "
                                        "512,1024,2048 --batches 1 --repeats 5 --out benchmarks/results/t5_encoder_B1",
    "benchmarks/results/xlnet_terms/t5_B1": "python -m benchmarks.run --only train,memory --schemes t5 --lengths "
                                            "1024,2048 --batches 1 --repeats 5 --out benchmarks/results/xlnet_terms/t5_B1",
    "benchmarks/results/decode_compiled_epyc": "python -m benchmarks.run --only decode --decode-compile --decode-batch 8 "
                                               "--decode-repeats 5 --out benchmarks/results/decode_compiled_epyc",
    "benchmarks/results/decode_packed": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                        "--decode-repeats 5 --out benchmarks/results/decode_packed",
    "benchmarks/results/decode_packed/again": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                              "--decode-repeats 5 --out benchmarks/results/decode_packed/again",
    "benchmarks/results/decode_packed/before": None,  # the same command on the library before packed weights
    "benchmarks/results/decode_lean": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                      "--decode-repeats 5 --out benchmarks/results/decode_lean",
    "benchmarks/results/decode_lean/again": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                            "--decode-repeats 5 --out benchmarks/results/decode_lean/again",
    "benchmarks/results/decode_lean/again_2": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                              "--decode-repeats 5 --out benchmarks/results/decode_lean/again_2",
    "benchmarks/results/decode_lean/before": None,  # the same command on the library before the leaner steps
    "benchmarks/results/decode_quiet": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                       "--decode-repeats 7 --out benchmarks/results/decode_quiet",
    "benchmarks/results/decode_quiet/again": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                             "--decode-repeats 7 --out benchmarks/results/decode_quiet/again",
    "benchmarks/results/decode_quiet/again_2": "python -m benchmarks.run --only decode --threads 2 --decode-batch 8 "
                                               "--decode-repeats 7 --out benchmarks/results/decode_quiet/again_2",
    "benchmarks/results/alibi_offsets/L2048": "python -m benchmarks.run --only train,memory --schemes alibi --lengths "
                                              "2048 --batches 1,2 --repeats 3 --out "
                                              "benchmarks/results/alibi_offsets/L2048",
    "benchmarks/results/batches/decode_profile_eager": "python -m benchmarks.decode_profile --threads 2 --schemes "
                                                       "none,t5,deberta --out benchmarks/results/batches/"
                                                       "decode_profile_eager",
    "benchmarks/results/batches/decode_profile_compiled": "python -m benchmarks.decode_profile --threads 2 --compile "
                                                          "--schemes none,t5,deberta --out benchmarks/results/batches/"
                                                          "decode_profile_compiled",
    "benchmarks/results/decode_profile.json": "python -m benchmarks.decode_profile --out benchmarks/results --overwrite",
    "benchmarks/results/train_speed.json": "python -m benchmarks.train_speed --out benchmarks/results/train_speed.json "
                                           "--overwrite",
    **{f"benchmarks/results/{name}": None for name in (
        "bf16_check.json", "calibrate_gpu_profile_cpu.json", "decode_1thread.json", "decode_previous_run.json",
        "decode_profile_previous_run.json", "decode_second_run.json", "train_L1024_blocks_2threads.json",
        "train_full_keys.json", "train_previous_run.json")},
}
#: what :func:`entry_for` returns for a path no entry of :data:`RESULT_COMMANDS` holds
NO_MATCH = object()


def entry_for(path: Path):
    """The entry of :data:`RESULT_COMMANDS` whose folder (or file) holds ``path`` (the longest match), or
    ``NO_MATCH``."""
    parts = Path(os.path.normpath(os.path.abspath(path))).parts
    best = None
    for folder, command in RESULT_COMMANDS.items():
        key = Path(folder).parts
        for i in range(len(parts) - len(key) + 1):
            if parts[i : i + len(key)] == key and (best is None or len(key) > len(best[0])):
                best = (key, command)
    return best[1] if best else NO_MATCH


def _command_for(path: Path) -> str | None:
    """The command of :data:`RESULT_COMMANDS` whose folder holds ``path`` (the longest match), if any."""
    entry = entry_for(path)
    return None if entry is NO_MATCH else entry


def results_file(path, command: str | None = None) -> Path:
    """``path`` (a ``Path``) if that results file exists; else ``FileNotFoundError`` in one line naming the
    file and the command that makes it (``command``, or the one :data:`RESULT_COMMANDS` gives for its folder).

    For lesson cells that read committed results, e.g.
    ``json.loads(results_file(root / "results/long_context_extra/t5_seed0.json").read_text())``.
    """
    path = Path(path)
    if path.is_file():
        return path
    command = command or _command_for(path)
    what = "is a folder, not a results file" if path.is_dir() else "does not exist yet"
    if not command and entry_for(path) is None:
        raise FileNotFoundError(f"{path} {what.removesuffix(' yet')}: it records an earlier measurement, which no "
                                f"command makes again; restore the committed file (git checkout -- {path})")
    how = (f"make it with `{command}` (from the repository root; see the README's \"Experiments\")"
           if command else "it is made by the experiment that writes this folder (see the README)")
    raise FileNotFoundError(f"{path} {what}: {how}, or restore the committed results (git checkout -- {path})")


def results_files(folder, pattern: str, command: str | None = None) -> list[Path]:
    """The files of ``folder`` matching ``pattern`` (sorted); none is ``FileNotFoundError`` naming the folder,
    the pattern and the command that makes them (as :func:`results_file`)."""
    folder = Path(folder)
    found = sorted(folder.glob(pattern)) if folder.is_dir() else []
    if found:
        return found
    command = command or _command_for(folder / pattern)
    how = (f"make them with `{command}` (from the repository root)" if command
           else "they are made by the experiment that writes this folder (see the README)")
    raise FileNotFoundError(f"no {pattern} in {folder} yet: {how}, or restore the committed results "
                            f"(git checkout -- {folder})")


#: the batch-axis grids of the AMD EPYC (``benchmarks/results/<folder>``, each a ``train_batches.json`` and a
#: ``memory_batches.json``) from ``batches_epyc_2`` on: each measured the library after a change to some schemes
BATCH_GRIDS = (
    "batches_epyc_2", "batches_epyc_2/L2048", "batches_epyc_2/B32", "alibi_offsets", "alibi_offsets/L2048",
    "deberta_blocks", "t5_offsets", "t5_offsets/L2048", "xlnet_blocks", "xlnet_blocks/L2048", "clipped_sides",
    "clipped_sides/L2048", "t5_sides", "t5_sides/L2048", "sides_B32", "sides_B8_L2048", "batch_chunks",
    "batch_chunks/B32", "batch_chunks/B8_L2048", "batch_chunks/B16_L2048", "sides_B16_L2048", "fused_B1_L512",
    "sides_B32_L2048", "t5_shaw_chunks", "t5_shaw_chunks/L2048", "t5_shaw_chunks/L512_1024", "xlnet_terms",
    "xlnet_terms/B32", "t5_encoder_B1", "deberta_L2048", "b1_L2048",
)  # fmt: skip


def latest_batch_readings(bench, grids=BATCH_GRIDS) -> dict:
    """``(scheme, length, batch) -> (time ratio, peak-memory ratio, folder)`` for every scheme but ``none``: at each
    shape, the reading of the latest of ``grids`` (folders of ``bench``, ordered by when their training part was made)
    that measured the scheme there.  Each ratio is to ``none`` in the same run, so readings of different runs sit
    side by side; a run measured the library of its day, which is why the latest one counts."""
    import json

    runs = []
    for name in grids:
        train = json.loads(results_file(Path(bench) / name / "train_batches.json").read_text())
        memory = json.loads(results_file(Path(bench) / name / "memory_batches.json").read_text())["results"]["batches"]
        runs.append((train["created"], name, train["results"]["batches"], memory))
    readings = {}
    for _, name, train, memory in sorted(runs):
        for b, per_length in train.items():
            for length, schemes in per_length["lengths"].items():
                for pe, x in schemes.items():
                    if pe != "none":
                        peak = memory[b]["lengths"][length]["schemes"][pe]["ratio_peak"]
                        readings[pe, int(length), int(b)] = (x["ratio"], peak, name)
    return readings


def batch_table(readings: dict, goals: dict, lengths, sizes, memory_goal: float = 1.3) -> str:
    """Lines of a table of ``readings`` (``(scheme, length, batch) -> (time ratio, peak-memory ratio, ...)``), one
    row per scheme of ``goals`` (``scheme -> time goal``) and length of ``lengths``, one column per batch size of
    ``sizes``: ``time/memory``, ``*`` after a ratio over its goal (``memory_goal`` for memory), ``-`` where a shape
    was not measured."""
    lines = [f"{'scheme':<9}{'L':>6}" + "".join(f"{'B=' + str(b):>13}" for b in sizes) + f"{'goal':>8}"]
    for pe, goal in goals.items():
        for length in lengths:
            row = ""
            for b in sizes:
                reading = readings.get((pe, length, b))
                if reading is None:
                    row += f"{'-':>13}"
                    continue
                t, m = reading[:2]
                row += f"{t:>6.2f}{'*' if t > goal else ' '}/{m:.2f}{'*' if m > memory_goal else ' '}"
            lines.append(f"{pe:<9}{length:>6}{row}{'<= ' + str(goal):>8}")
    return "\n".join(lines)
