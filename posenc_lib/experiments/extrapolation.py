"""Length extrapolation: train on short sequences, test on long ones, for every scheme.

The experiment behind notebooks/13_length_extrapolation.ipynb.  The question
comes from Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with
Linear Biases Enables Input Length Extrapolation" (ALiBi, arXiv:2108.12409)
and Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers" (arXiv:2305.19466): does a model trained on
sequences of at most ``L`` tokens still work at ``2L``, ``4L``?

The task (``reverse``, default; ``copy`` is the easier variant)::

    source  a7 a2 a2 a9 a0 </s>       (n random symbols, n in [train_min_len, train_max_len], then the anchor)
    target  a0 a9 a2 a2 a7 </s>       (the same symbols, reversed, then end-of-sequence)

Why it isolates position: the output is a permutation of the input, and the
permutation depends on nothing but positions (target token ``t`` is source
token ``n - 1 - t``).  Symbols are uniform and independent, so there is no
language prior to lean on; the vocabulary and the mapping are trivial.  What
has to generalise to unseen lengths is exactly the model's sense of "where":
which source position to read at output step ``t``, and when to stop.

The source ends in ``</s>`` (``anchored=True``, the default, as in the WMT14
pipeline): a relative scheme in a bidirectional encoder has no other way to
tell where the sequence ends.  ``anchored=False`` drops it, for comparison.

Two architectures (``arch``): ``encdec``, the course's encoder-decoder, and
``decoder``, a decoder-only causal LM reading ``source <bos> target`` with the
loss on the target only (the setting of Kazemnejad et al.).  Table sizes of the
learned relative schemes are scaled to the training sequence length ``S``
(``table_sizes="scaled"``): Shaw's clip ``k = S // 2``, T5 about ``S`` buckets
(a quarter of them exact per side in the encoder) up to distance ``S``, DeBERTa
``2 * (S // 4)`` buckets up to distance ``S - 1`` (the longest distance in
training), so that every entry is reached in training; ``"library"`` keeps the library defaults.  With ``S = 17`` (16
symbols and the anchor): ``k = 8``, 16 T5 buckets, 8 DeBERTa buckets.

Training runs until the model has mastered the training lengths (teacher-forced
exact match >= ``mastery`` on a fixed set of training-length sequences, checked
every ``check_every`` updates; teacher-forced exact match equals greedy exact
match) or until ``steps``, a cap that is reported.  The ``budget`` profile instead gives every run
the same ``steps`` on the full schedule and judges mastery per training length (200 sequences
each), recording it along the way (``mastery_curve``, ``first_mastered``, ``mastery_by_length``).  Score-bias tables (T5)
learn ``bias_lr_scale`` times faster than the rest.  Runs whose name ends in
``-rand`` train with randomized positions (Ruoss et al. 2023,
arXiv:2305.16843): each batch reads its positions from a sorted random sample
of ``[0, random_positions_max)``, at training and at test time.

Metrics per test length: *exact match* (the whole output, end token included,
is right) and *per-token accuracy* (fraction of the ``n`` target positions
predicted right; a short output counts its missing tokens as wrong), both also per target
position (``position_accuracy``; ``tf_`` for the teacher-forced ones).  A learned
absolute table sized to the training length has no row for later positions:
the model raises ``ValueError`` there, which is recorded as accuracy 0 with
``representable: false`` -- a failure shown, not hidden.

Results: one JSON file per (scheme, seed), written atomically as soon as that
model finishes; a rerun skips finished files, so a long run can resume.

Command line::

    python -m posenc_lib.experiments.extrapolation --profile smoke      # -> runs/extrapolation-smoke
    python -m posenc_lib.experiments.extrapolation --profile course --arch encdec --pe all --seeds 0 --out results/extrapolation_course/encdec --jobs 2
    python -m posenc_lib.experiments.extrapolation --profile course --arch decoder --pe all --seeds 0 --out results/extrapolation_course/decoder --jobs 2
    python -m posenc_lib.experiments.extrapolation --profile course --pe none,rope-rand --seeds 0 --lr 4e-3 --out results/extrapolation_course/lr_sweep/encdec_lr4e-3
    python -m posenc_lib.experiments.extrapolation --profile budget --arch decoder --pe none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide --seeds 0,1,2,3,4 --out results/extrapolation_budget/reverse/decoder --jobs 2
    python -m posenc_lib.experiments.extrapolation --profile budget --arch encdec --pe none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,alibi-split --seeds 0,1,2,3,4 --out results/extrapolation_budget/reverse/encdec --jobs 2
    (the same with --task copy and --out results/extrapolation_budget/copy/ARCH for the second task;
    scripts/extrapolation_budget.sh runs them all, seed by seed)
    python -m posenc_lib.experiments.extrapolation --profile budget --task reverse --arch decoder --steps 16000 --pe none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide --seeds 0,1,2,3,4 --out results/extrapolation_budget_16000/reverse/decoder --jobs 2
    (decoder-only reversal with the longer budget lesson 13 reads for it; scripts/extrapolation_budget_16000.sh)
"""
from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..attention.layer import PositionScheme
from ..models.decoding import greedy_decode
from ..models.causal_lm import CausalLM
from ..models.seq2seq import Seq2SeqTransformer, build_model
from ..schemes.registry import PE_TYPES, canonical_pe
from ..checks import check_choice, check_divides, check_float_range, check_int_range, check_positive_int
from ..cli import CliParser
from ..files import atomic_write_json, read_json
from ..seeds import parse_seed_list, set_seed
from ..stats import interval95
from . import runner

PAD, BOS, EOS = 0, 1, 2
#: extra runs beside PE_TYPES: name -> (scheme, options).  A symmetric ALiBi encoder cannot tell a
#: sequence from its reversal (see posenc_lib/schemes/alibi.py), which decides the reversal task by itself;
#: the split variant shows what ALiBi does once it knows left from right.
#: ``-rand`` runs train with randomized positions (Ruoss et al. 2023), the remedy tried for the
#: absolute and rotary schemes.  ``t5-wide`` keeps T5's own table (32 buckets up to distance 128, as
#: in the T5 paper and the ``transformers`` default) instead of one scaled to the training length:
#: its logarithmic buckets then already cover longer distances in training, the setting of
#: Kazemnejad et al.; it is not part of ``--pe all``.
VARIANTS: dict[str, tuple[str, dict]] = {
    "alibi-split": ("alibi", {"bidirectional": "split"}),
    "sinusoidal-rand": ("sinusoidal", {"randomized": True}),
    "learned-rand": ("learned", {"randomized": True}),
    "rope-rand": ("rope", {"randomized": True}),
    "t5-wide": ("t5", {"library_table": True}),
}
RUN_ORDER: tuple[str, ...] = PE_TYPES + tuple(VARIANTS)
ARCHS = ("encdec", "decoder")
#: the runs of the budget design (scripts/extrapolation_budget.sh), per architecture: every scheme, split ALiBi where
#: it differs from ALiBi (the encoder), and T5 with its library table where Kazemnejad et al. tested it (decoder-only)
BUDGET_RUNS: dict[str, tuple[str, ...]] = {"encdec": PE_TYPES + ("alibi-split",), "decoder": PE_TYPES + ("t5-wide",)}
TABLE_SIZES = ("scaled", "library")


def run_name(pe: str) -> str:
    """A canonical scheme name, or a name from :data:`VARIANTS`."""
    if isinstance(pe, str) and pe.strip().lower() in VARIANTS:
        return pe.strip().lower()
    return canonical_pe(pe)
#: id of the first symbol; symbols are ``FIRST_SYMBOL .. FIRST_SYMBOL + n_symbols - 1``
FIRST_SYMBOL = 3
TASKS = ("reverse", "copy")
SCHEMA = "posenc.extrapolation/1"  # new fields (arch, mastery, ...) are additions: old files still load
#: configuration fields added after results were committed, with the value older records were made with
ADDED_DEFAULTS: dict[str, Any] = {"mastery_examples": 0, "stop_at_mastery": True, "lr_floor": 0.1}


@dataclass(frozen=True)
class ExtrapolationConfig:
    """Everything that defines one run; the same for every scheme and seed."""

    name: str = "course"
    # -- the task -----------------------------------------------------------------------------
    task: str = "reverse"  # "reverse" or "copy"
    anchored: bool = True  # append </s> to every source (as the WMT14 pipeline does); False: no end marker
    arch: str = "encdec"  # "encdec": encoder-decoder; "decoder": decoder-only LM over `source <bos> target`
    n_symbols: int = 16  # alphabet size (plus PAD, BOS, EOS)
    train_min_len: int = 2  # training lengths are drawn uniformly from [train_min_len, train_max_len]
    train_max_len: int = 16
    test_lengths: tuple[int, ...] = (4, 8, 12, 16, 20, 24, 32, 48, 64)  # up to 4x train_max_len
    # -- the model (small: every scheme x seed must fit a CPU budget) -------------------------
    d_model: int = 64
    n_heads: int = 4
    num_layers: int = 2  # encoder layers; the decoder has as many
    dim_feedforward: int = 256
    dropout: float = 0.0  # fresh data every step: nothing to regularise against
    table_sizes: str = "scaled"  # "scaled": relative tables sized to the training length (see module doc)
    random_positions_max: int = 256  # -rand runs: positions sampled from [0, this); > longest test sequence
    # -- training: the same budget (updates x batch) for every scheme -------------------------
    steps: int = 1200  # with mastery > 0: the cap; otherwise the number of updates
    batch_size: int = 32  # sequences per update (many small updates learn faster on a CPU)
    lr: float = 2e-3  # Adam peak learning rate; linear warm-up, then cosine decay to lr_floor * lr at `steps`
    lr_floor: float = 0.1  # the last update's learning rate as a fraction of the peak
    warmup: int = 100
    grad_clip: float = 1.0
    bias_lr_scale: float = 1.0  # learning-rate factor for score-bias tables (T5's): one scalar per bucket
    mastery: float = 0.0  # stop once teacher-forced exact match at training lengths >= this (0: fixed steps)
    check_every: int = 100  # updates between mastery checks
    mastery_examples: int = 0  # > 0: judge every training length on its own set of this many sequences
    stop_at_mastery: bool = True  # False: train all `steps` on the full schedule, record mastery along the way
    # -- evaluation ---------------------------------------------------------------------------
    eval_examples: int = 200  # test sequences per length (fixed, the same for every model)
    eval_batch_size: int = 200
    eval_seed: int = 12345  # the test sets depend on this only, never on the training seed
    threads: int = 1  # torch threads per model while it trains (see run_one); use --jobs for more cores

    def __post_init__(self):
        """Refuse a bad field before anything runs, naming the field and its allowed range."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        check_choice("task", self.task, TASKS)
        check_choice("arch", self.arch, ARCHS)
        check_choice("table_sizes", self.table_sizes, TABLE_SIZES)
        for f in ("anchored", "stop_at_mastery"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f} must be True or False, got {getattr(self, f)!r}")
        check_int_range("mastery_examples", self.mastery_examples, 0)
        for f in ("n_symbols", "train_min_len", "train_max_len", "d_model", "n_heads", "num_layers",
                  "dim_feedforward", "steps", "batch_size", "eval_examples", "eval_batch_size", "threads",
                  "check_every", "random_positions_max"):  # fmt: skip
            check_positive_int(f, getattr(self, f))
        if self.train_min_len > self.train_max_len:
            raise ValueError(
                f"train_min_len={self.train_min_len} > train_max_len={self.train_max_len}: "
                f"train_min_len must lie in [1, train_max_len]"
            )
        if isinstance(self.test_lengths, (str, bytes)) or not isinstance(self.test_lengths, Iterable):
            raise TypeError(f"test_lengths must be a tuple of positive integers, got {self.test_lengths!r}")
        lengths = tuple(self.test_lengths)
        if not lengths:
            raise ValueError("test_lengths must name at least one length")
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"test_lengths: every test length must be a positive integer, got {n!r}")
        object.__setattr__(self, "test_lengths", lengths)  # a list given by hand becomes the tuple stored
        head_dim = check_divides(self.d_model, self.n_heads)
        if self.d_model % 2 or head_dim % 2:  # sinusoidal pairs d_model, rope pairs each head's dimensions
            raise ValueError(
                f"d_model={self.d_model} and d_model / n_heads={head_dim} must both be even "
                "(sin/cos and rotation pairs), e.g. d_model=64 with n_heads=4"
            )
        check_float_range("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_float_range("lr", self.lr, 0.0, low_open=True)
        check_float_range("lr_floor", self.lr_floor, 0.0, 1.0)
        check_int_range("warmup", self.warmup, 0)
        check_float_range("grad_clip", self.grad_clip, 0.0, low_open=True)
        check_float_range("bias_lr_scale", self.bias_lr_scale, 0.0, 1000.0, low_open=True)
        check_float_range("mastery", self.mastery, 0.0, 1.0)
        if self.random_positions_max < self.max_sequence_length(max(lengths)):
            raise ValueError(
                f"random_positions_max={self.random_positions_max} must be at least the longest test sequence "
                f"({self.max_sequence_length(max(lengths))} tokens for the largest of test_lengths, {max(lengths)})"
            )
        check_int_range("eval_seed", self.eval_seed, 0, 2**53)

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.n_symbols

    def source_length(self, n: int) -> int:
        """Tokens in the source of ``n`` symbols (the anchor included)."""
        return n + int(self.anchored)

    def max_sequence_length(self, n: int) -> int:
        """Longest position-coded sequence for ``n`` symbols: one stack's input (encdec) or the whole LM input."""
        if self.arch == "decoder":
            return self.source_length(n) + n + 1  # source, <bos>, target (the final </s> is only predicted)
        return max(self.source_length(n), n + 1)  # encoder: source; decoder: <bos> + target

    @property
    def learned_max_len(self) -> int:
        """Rows of the learned table: the longest sequence one stack reads at the training lengths."""
        return self.max_sequence_length(self.train_max_len)

    def table_options(self, pe: str) -> dict:
        """Table sizes of the learned relative schemes (``table_sizes="scaled"``; see the module doc)."""
        if self.table_sizes == "library":
            return {}
        s = self.max_sequence_length(self.train_max_len)
        return {"shaw": {"max_relative_position": s // 2},
                "t5": {"num_buckets": max(4, 2 * (s // 2)), "max_distance": s},
                "deberta": {"position_buckets": max(4, 2 * (s // 4)), "max_relative_positions": s - 1}}.get(pe, {})  # fmt: skip


#: ``smoke``: a few seconds of CPU per model, for CI and for the notebook when no results are committed.
#: Lengths 2..6, tested to 24; one small layer each side; learns the task only partly.
SMOKE = ExtrapolationConfig(
    name="smoke", train_max_len=6, test_lengths=(3, 6, 9, 12, 18, 24), d_model=32, n_heads=4, num_layers=1,
    dim_feedforward=64, steps=300, batch_size=32, lr=5e-3, warmup=20, eval_examples=50, eval_batch_size=50,
    random_positions_max=64,
)  # fmt: skip
#: ``course``: train every run to mastery of lengths 2..16 (exact match >= 0.99 at the training
#: lengths) or 2000 updates, T5's bias table at 10x the learning rate, tables scaled to the training
#: length, the source anchored by </s>.  Lesson 13 reads its results.
COURSE = ExtrapolationConfig(name="course", steps=2000, mastery=0.99, bias_lr_scale=10.0)
#: ``budget``: one fixed budget for every run (``steps`` updates on the full schedule, whatever the
#: scheme), one learning-rate rule for every parameter (T5's bias table included), and mastery
#: judged per training length on 200 sequences each (exact match >= 0.99 at every length 2..16),
#: checked every 500 updates and recorded, not used to stop.  The rate decays to 1% of its peak, so
#: that a run ends converged rather than fluctuating around the threshold.  How the budget was sized
#: (and why decoder-only reversal trains with ``--steps 16000``): results/README.md.
BUDGET = ExtrapolationConfig(name="budget", steps=8000, mastery=0.99, mastery_examples=200, stop_at_mastery=False,
                             check_every=500, bias_lr_scale=1.0, lr_floor=0.01)  # fmt: skip
#: ``pilot``: the first version of the experiment (no anchor, library table sizes, 1200 updates with
#: cosine decay for every run, one learning rate); its results are in results/extrapolation/.
PILOT = ExtrapolationConfig(name="pilot", anchored=False, table_sizes="library", random_positions_max=256)
PROFILES: dict[str, ExtrapolationConfig] = {"smoke": SMOKE, "course": COURSE, "budget": BUDGET, "pilot": PILOT}


# -- the task -------------------------------------------------------------------------------------
def target_of(task: str, symbols: torch.Tensor) -> torch.Tensor:
    """The target symbols for one source ``symbols (n,)``: reversed or copied."""
    check_choice("task", task, TASKS)
    return symbols.flip(0) if task == "reverse" else symbols.clone()


def make_batch(cfg: ExtrapolationConfig, lengths: Sequence[int], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A padded batch with one example per entry of ``lengths``.

    Returns ``src (B, S)`` (the symbols, then EOS when ``cfg.anchored``), ``tgt_in (B, T)``
    = BOS + target, ``tgt_out (B, T)`` = target + EOS, the padding masks ``src_pad (B, S)``,
    ``tgt_pad (B, T)`` (True at PAD) and ``lengths (B,)``; ``S = max(lengths) + anchored``,
    ``T = max(lengths) + 1``.
    """
    lengths = [check_positive_int("length", n) for n in lengths]
    if not lengths:
        raise ValueError("lengths must not be empty")
    b, s = len(lengths), max(lengths)
    src = torch.full((b, cfg.source_length(s)), PAD, dtype=torch.long)
    tgt_in = torch.full((b, s + 1), PAD, dtype=torch.long)
    tgt_out = torch.full((b, s + 1), PAD, dtype=torch.long)
    sym = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + cfg.n_symbols, (b, s), generator=generator)
    for i, n in enumerate(lengths):
        x = sym[i, :n]
        y = target_of(cfg.task, x)
        src[i, :n] = x
        if cfg.anchored:
            src[i, n] = EOS
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : n + 1] = y
        tgt_out[i, :n] = y
        tgt_out[i, n] = EOS
    return {
        "src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "src_pad": src == PAD,
        "tgt_pad": tgt_in == PAD, "lengths": torch.tensor(lengths),
    }  # fmt: skip


def lm_batch(cfg: ExtrapolationConfig, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder-only form of ``batch``: ``tokens (B, L)`` = source, BOS, target; ``labels (B, L)``.

    ``labels[i, p]`` is the token the LM must predict after reading ``tokens[i, :p + 1]``: the
    target symbols and EOS after the source (-100 elsewhere, ignored by the loss).  Rows are
    right-padded; under the causal mask a padded tail never reaches an earlier position.
    """
    rows = []
    for i, n in enumerate(batch["lengths"].tolist()):
        m = cfg.source_length(n)
        rows.append((torch.cat((batch["src"][i, :m], batch["tgt_in"][i, : n + 1])), m, batch["tgt_out"][i, : n + 1]))
    width = max(len(r[0]) for r in rows)
    tokens = torch.full((len(rows), width), PAD, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (seq, m, out) in enumerate(rows):
        tokens[i, : len(seq)] = seq
        labels[i, m : m + len(out)] = out
    return tokens, labels


def train_lengths(cfg: ExtrapolationConfig, batch_size: int, generator: torch.Generator) -> list[int]:
    return torch.randint(cfg.train_min_len, cfg.train_max_len + 1, (batch_size,), generator=generator).tolist()


def test_batch(cfg: ExtrapolationConfig, length: int) -> dict[str, torch.Tensor]:
    """The fixed test set for one length (depends on ``cfg.eval_seed`` and ``length`` only)."""
    g = torch.Generator().manual_seed(cfg.eval_seed * 1000 + length)
    return make_batch(cfg, [length] * cfg.eval_examples, g)


# -- model, training, evaluation ------------------------------------------------------------------
@contextmanager
def num_threads(n: int):
    """Run the block with ``n`` torch threads, then restore the previous number.

    Models this small run best on one thread: on a busy 2-core machine two intra-op
    threads made the same training run (identical losses) about 12x slower in CPU time.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_table_options(pe: str, cfg: ExtrapolationConfig) -> dict:
    """The table sizes run ``pe`` is built with: the configuration's, or the library's for ``t5-wide``."""
    name = run_name(pe)
    base, extra = VARIANTS.get(name, (name, {}))
    return {} if extra.get("library_table") else cfg.table_options(base)


def make_model(pe: str, cfg: ExtrapolationConfig) -> Seq2SeqTransformer | CausalLM:
    """The model of run ``pe`` (a scheme or a :data:`VARIANTS` name) for ``cfg.arch``.

    A learned table gets exactly ``cfg.learned_max_len`` rows (``cfg.random_positions_max``
    for ``-rand``); relative tables get :meth:`ExtrapolationConfig.table_options`.  The
    decoder-only model has ``2 * num_layers`` layers, as many as encoder and decoder together.
    """
    name = run_name(pe)
    pe, extra = VARIANTS.get(name, (name, {}))
    extra = dict(extra)
    randomized = extra.pop("randomized", False)
    extra.update(run_table_options(name, cfg))
    extra.pop("library_table", None)
    if pe == "learned":
        extra["max_len"] = cfg.random_positions_max if randomized else cfg.learned_max_len
    if cfg.arch == "decoder":
        model = CausalLM(cfg.vocab_size, pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=2 * cfg.num_layers,
                         dim_feedforward=cfg.dim_feedforward, **extra)  # fmt: skip
        schemes = [model.scheme]
    else:
        model = build_model(
            pe, cfg.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
            dim_feedforward=cfg.dim_feedforward, dropout=cfg.dropout, pad_id=PAD, **extra,
        )  # fmt: skip
        schemes = [model.enc_scheme, model.dec_scheme]
    if randomized:
        for scheme in schemes:
            _randomize(scheme)
    return model


def _randomize(scheme: PositionScheme) -> None:
    """Route the positions ``scheme`` sees through ``scheme.position_map`` whenever one is set.

    The map is a sorted sample of ``[0, random_positions_max)``: position ``p`` of a
    sequence is read as ``position_map[p]``.  Order is kept (the causal mask still holds),
    distances and absolute values are those of a longer sequence (Ruoss et al. 2023).
    """
    embed, prepare = scheme.embed, scheme.prepare
    scheme.position_map = None

    def mapped(p: torch.Tensor) -> torch.Tensor:
        return p if scheme.position_map is None else scheme.position_map[p]

    scheme.embed = lambda positions: embed(mapped(positions))
    scheme.prepare = lambda q_pos, k_pos: prepare(mapped(q_pos), mapped(k_pos))


def randomized_schemes(model) -> list[PositionScheme]:
    """The position schemes of ``model`` that read randomized positions (empty for other runs)."""
    return [m for m in model.modules() if isinstance(m, PositionScheme) and hasattr(m, "position_map")]


def sample_positions(model, cfg: ExtrapolationConfig, length: int, generator: torch.Generator) -> None:
    """Give every randomized scheme of ``model`` one fresh sorted sample of ``length`` positions."""
    schemes = randomized_schemes(model)
    if schemes:
        if length > cfg.random_positions_max:
            raise ValueError(f"length {length} exceeds random_positions_max={cfg.random_positions_max}")
        pos = torch.randperm(cfg.random_positions_max, generator=generator)[:length].sort().values
        for scheme in schemes:
            scheme.position_map = pos


def lr_at(step: int, cfg: ExtrapolationConfig) -> float:
    """Linear warm-up to ``cfg.lr``, then cosine decay to ``cfg.lr_floor * cfg.lr`` at step ``cfg.steps`` (the cap).

    Training to mastery stops wherever the model masters the training lengths, on this same
    schedule: a fast learner stops at a high rate, a slow one gets the decay it needs to converge.
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.lr_floor + (1 - cfg.lr_floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def param_groups(model, cfg: ExtrapolationConfig) -> list[dict]:
    """Adam groups: score-bias tables (T5) at ``cfg.bias_lr_scale`` times the rate, the rest at 1x."""
    fast = {id(p) for m in model.modules() if isinstance(m, PositionScheme) and m.adds_bias for p in m.parameters()}
    params = list(model.parameters())
    groups = [{"params": [p for p in params if id(p) not in fast], "lr_scale": 1.0}]
    if fast:
        groups.append({"params": [p for p in params if id(p) in fast], "lr_scale": cfg.bias_lr_scale})
    return groups


def batch_loss(model, cfg: ExtrapolationConfig, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the target tokens (and EOS) of batch ``b`` for either architecture."""
    if cfg.arch == "decoder":
        tokens, labels = lm_batch(cfg, b)
        logits = model(tokens)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return model.loss(b["src"], b["tgt_in"], b["tgt_out"], src_key_padding_mask=b["src_pad"],
                      tgt_key_padding_mask=b["tgt_pad"])  # fmt: skip


def mastery_batch(cfg: ExtrapolationConfig) -> dict[str, torch.Tensor]:
    """A fixed set of training-length sequences (every length equally often) for the mastery check."""
    lengths = [cfg.train_min_len + i % (cfg.train_max_len - cfg.train_min_len + 1) for i in range(cfg.eval_examples)]
    return make_batch(cfg, lengths, torch.Generator().manual_seed(cfg.eval_seed + 7))


def mastery_batches(cfg: ExtrapolationConfig) -> dict[int, dict[str, torch.Tensor]]:
    """One fixed set of ``cfg.mastery_examples`` sequences per training length (per-length mastery).

    Drawn from seeds the test sets never use (``eval_seed * 1000 + 500 + n``), so a model is
    judged in range on sequences it is not tested on beyond it.
    """
    return {n: make_batch(cfg, [n] * cfg.mastery_examples, torch.Generator().manual_seed(cfg.eval_seed * 1000 + 500 + n))
            for n in range(cfg.train_min_len, cfg.train_max_len + 1)}  # fmt: skip


def mastery_by_length(model, cfg: ExtrapolationConfig, batches: dict[int, dict[str, torch.Tensor]]) -> dict[int, float]:
    """Teacher-forced exact match (= greedy exact match) of every training length's own set."""
    out = {}
    for n, b in batches.items():
        k, total = b["src"].shape[0], 0.0
        for i in range(0, k, cfg.eval_batch_size):
            part = {key: v[i : i + cfg.eval_batch_size] for key, v in b.items()}
            total += teacher_forced(model, cfg, part)[0] * part["src"].shape[0]
        out[n] = round(total / k, 4)
    return out


def _by_position(right: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Right predictions per target position, summed over the batch: ``(n + 1,)`` for ``n`` symbols and EOS.

    Every row must have the same number of target positions (one test length per batch).
    """
    counts = real.sum(1)
    if counts.numel() and not bool((counts == counts[0]).all()):
        raise ValueError("per-position accuracy needs one length per batch; got rows with "
                         f"{sorted(set(counts.tolist()))} target positions")  # fmt: skip
    return right[real].view(real.shape[0], -1).float().sum(0)


@torch.no_grad()
def teacher_forced(model, cfg: ExtrapolationConfig, b: dict[str, torch.Tensor], *, positions: bool = False):
    """Teacher-forced exact match and per-token accuracy of batch ``b`` (target tokens and EOS).

    Exact match: the fraction of sequences whose every target token is the argmax given the
    right prefix.  It equals greedy exact match: a greedy decoder that is right so far sees
    exactly the teacher-forced prefix, so it stays right to the end token iff every argmax is
    right.  Per-token accuracy here counts the target symbols predicted right *given the right
    prefix* (greedy per-token accuracy can only be lower: its errors compound).

    ``positions=True`` (a batch of one length ``n``) also returns the number of sequences right
    at each target position ``0 .. n`` (the last is EOS), given the right prefix.
    """
    was = model.training
    model.eval()
    if cfg.arch == "decoder":
        tokens, labels = lm_batch(cfg, b)
        pred = model(tokens).argmax(-1)
    else:
        labels = b["tgt_out"].masked_fill(b["tgt_out"] == PAD, -100)
        pred = model(b["src"], b["tgt_in"], src_key_padding_mask=b["src_pad"], tgt_key_padding_mask=b["tgt_pad"]).argmax(-1)
    model.train(was)
    real = labels != -100
    right = pred == labels
    symbols = real & (labels != EOS)
    exact = (right | ~real).all(dim=1).float().mean().item()
    token = ((right & symbols).sum(1).float() / symbols.sum(1).clamp(min=1)).mean().item()
    if positions:
        return exact, token, _by_position(right, real)
    return exact, token


def train(pe: str, cfg: ExtrapolationConfig, seed: int, *, progress: bool = True, log_every: int = 50):
    """Train one model; returns ``(model, losses, info)``.

    ``losses``: the mean loss of every ``log_every`` steps; ``info``: ``steps`` run,
    ``mastered`` (None when ``cfg.mastery == 0``) and the teacher-forced exact match at the
    training lengths of every check (``mastery_curve``: ``[step, value]`` pairs).  With
    ``cfg.mastery_examples > 0`` the value is the lowest of the per-length exact matches, and
    ``info`` also holds ``mastery_by_length`` (``{length: exact match}`` at the last check) and
    ``first_mastered`` (the first checked update at which every length reached ``cfg.mastery``,
    or None).
    """
    from tqdm.auto import tqdm

    set_seed(seed)
    model = make_model(pe, cfg)
    opt = torch.optim.Adam(param_groups(model, cfg), lr=cfg.lr, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(seed)
    model.train()
    losses: list[float] = []
    info: dict[str, Any] = {"steps": 0, "mastered": None, "mastery_curve": []}
    if cfg.mastery_examples:
        info.update(mastery_by_length=None, first_mastered=None)
    bar = tqdm(range(cfg.steps), desc=f"{run_name(pe)} seed {seed}", disable=not progress, leave=False)
    with num_threads(cfg.threads):
        _train_loop(model, opt, cfg, g, bar, losses, log_every, info)
    model.eval()
    for scheme in randomized_schemes(model):
        scheme.position_map = None
    return model, losses, info


def _train_loop(model, opt, cfg, g, bar, losses, log_every, info):
    window = []
    check = (mastery_batches(cfg) if cfg.mastery_examples else mastery_batch(cfg)) if cfg.mastery > 0 else None
    check_g = torch.Generator().manual_seed(cfg.eval_seed + 11)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg) * group["lr_scale"]
        b = make_batch(cfg, train_lengths(cfg, cfg.batch_size, g), g)
        sample_positions(model, cfg, cfg.max_sequence_length(cfg.train_max_len), g)
        loss = batch_loss(model, cfg, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(loss.item())
        info["steps"] = step + 1
        if len(window) == log_every or step == cfg.steps - 1:
            losses.append(sum(window) / len(window))
            window = []
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if check is not None and ((step + 1) % cfg.check_every == 0 or step == cfg.steps - 1):
            sample_positions(model, cfg, cfg.max_sequence_length(cfg.train_max_len), check_g)
            if cfg.mastery_examples:
                per_length = mastery_by_length(model, cfg, check)
                em = min(per_length.values())
                info["mastery_by_length"] = {str(n): v for n, v in per_length.items()}
                if em >= cfg.mastery and info["first_mastered"] is None:
                    info["first_mastered"] = step + 1
            else:
                em = teacher_forced(model, cfg, check)[0]
            info["mastery_curve"].append([step + 1, round(em, 4)])
            info["mastered"] = em >= cfg.mastery
            if info["mastered"] and cfg.stop_at_mastery:
                if window:
                    losses.append(sum(window) / len(window))
                break


def score(pred: torch.Tensor, batch: dict[str, torch.Tensor], *, positions: bool = False):
    """Exact match and per-token accuracy of greedy outputs ``pred (B, <= T+1)`` (BOS first).

    ``positions=True`` (a batch of one length) also returns the sequences right at each target position.
    """
    out = pred[:, 1:]
    want = batch["tgt_out"]
    t = want.shape[1]
    if out.shape[1] < t:  # decoding stopped early: pad so missing tokens count as wrong
        out = torch.cat((out, torch.full((out.shape[0], t - out.shape[1]), PAD, dtype=out.dtype)), dim=1)
    out = out[:, :t]
    real = want != PAD  # the n symbols and the EOS
    symbols = real & (want != EOS)
    correct = out == want
    exact = (correct | ~real).all(dim=1).float().mean().item()
    token = ((correct & symbols).sum(1).float() / symbols.sum(1).clamp(min=1)).mean().item()
    if positions:
        return exact, token, _by_position(correct, real)
    return exact, token


@torch.no_grad()
def evaluate(model: Seq2SeqTransformer, cfg: ExtrapolationConfig, lengths: Iterable[int] | None = None) -> list[dict]:
    """Greedy-decode the fixed test set of every length; one row per length.

    A ``ValueError`` from a learned table (a position beyond its rows) is
    recorded as ``representable: False`` with both accuracies 0.
    """
    with num_threads(cfg.threads):
        return [_evaluate_length(model, cfg, n) for n in (lengths if lengths is not None else cfg.test_lengths)]


def _evaluate_length(model, cfg: ExtrapolationConfig, n: int) -> dict:
    """Exact match and per-token accuracy at length ``n``.

    The encoder-decoder decodes greedily (with its cache).  The decoder-only model is scored
    teacher-forced (:func:`teacher_forced`): the same exact match, at a fraction of the cost of
    uncached decoding; its ``token_accuracy`` is then the teacher-forced one.  Both report
    ``tf_token_accuracy``, the teacher-forced per-token accuracy, for a comparison across the two.
    ``position_accuracy`` and ``tf_position_accuracy`` give the fraction of sequences right at
    each of the ``n + 1`` target positions (the last is EOS): greedy (encoder-decoder) or
    teacher-forced (decoder-only), and teacher-forced.
    """
    batch = test_batch(cfg, n)
    exact = token = tf_token = 0.0
    pos = torch.zeros(n + 1)
    tf_pos = torch.zeros(n + 1)
    representable = True
    try:
        sample_positions(model, cfg, cfg.max_sequence_length(n), torch.Generator().manual_seed(cfg.eval_seed + n))
        for i in range(0, cfg.eval_examples, cfg.eval_batch_size):
            part = {k: v[i : i + cfg.eval_batch_size] for k, v in batch.items()}
            e_tf, t_tf, p_tf = teacher_forced(model, cfg, part, positions=True)
            if cfg.arch == "decoder":
                e, t, p = e_tf, t_tf, p_tf
            else:
                pred = greedy_decode(model, part["src"], max_new_tokens=n + 1, bos_id=BOS, eos_id=EOS, use_cache=True)
                e, t, p = score(pred, part, positions=True)
            pos += p
            tf_pos += p_tf
            k = part["src"].shape[0]
            exact += e * k
            token += t * k
            tf_token += t_tf * k
        exact, token, tf_token = (v / cfg.eval_examples for v in (exact, token, tf_token))
        pos, tf_pos = pos / cfg.eval_examples, tf_pos / cfg.eval_examples
    except ValueError as err:
        if "beyond the learned table" not in str(err):
            raise
        exact = token = tf_token = 0.0
        pos, tf_pos = torch.zeros(n + 1), torch.zeros(n + 1)
        representable = False
    finally:
        for scheme in randomized_schemes(model):
            scheme.position_map = None
    return {"length": n, "exact_match": round(exact, 6), "token_accuracy": round(token, 6),
            "tf_token_accuracy": round(tf_token, 6), "representable": representable,
            "in_training_range": n <= cfg.train_max_len,
            "position_accuracy": [round(v, 4) for v in pos.tolist()],
            "tf_position_accuracy": [round(v, 4) for v in tf_pos.tolist()]}  # fmt: skip


@torch.no_grad()
def greedy_decode_lm(model: CausalLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of ``prompt (B, P)`` (source + BOS, no padding) by ``new_tokens`` tokens.

    Returns ``(B, 1 + new_tokens)``: BOS, then the generated tokens (the layout of
    :func:`~posenc_lib.models.decoding.greedy_decode`, so :func:`score` reads both).
    """
    seq = prompt
    for _ in range(new_tokens):
        seq = torch.cat((seq, model(seq)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return seq[:, prompt.shape[1] - 1 :]


# -- results on disk ------------------------------------------------------------------------------
def result_path(out: str | Path, pe: str, seed: int) -> Path:
    """One file per (run, seed); one folder per configuration (architecture, task, profile)."""
    return Path(out) / f"{run_name(pe)}_seed{seed}.json"


def run_one(pe: str, cfg: ExtrapolationConfig, seed: int, *, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate one (scheme, seed); returns the result record (see :data:`SCHEMA`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    model, losses, info = train(pe, cfg, seed, progress=progress)
    t1, c1 = time.perf_counter(), time.process_time()
    rows = evaluate(model, cfg)
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "schema": SCHEMA,
        "pe": run_name(pe),
        "seed": seed,
        "profile": cfg.name,
        "config": asdict(cfg),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "table_options": run_table_options(pe, cfg),
        "train": {"steps": info["steps"], "loss_every_50_steps": [round(x, 5) for x in losses],
                  "final_loss": round(losses[-1], 5), "seconds": round(t1 - t0, 1),
                  "cpu_seconds": round(c1 - c0, 1),
                  "mastered": info["mastered"], "mastery_curve": info["mastery_curve"],
                  **{k: info[k] for k in ("mastery_by_length", "first_mastered") if k in info}},  # fmt: skip
        "eval": rows,
        "token_accuracy_method": "teacher-forced" if cfg.arch == "decoder" else "greedy",
        "eval_seconds": round(t2 - t1, 1),
        "eval_cpu_seconds": round(c2 - c1, 1),
        "torch": torch.__version__,
    }


def _check_rows(rec: dict[str, Any]) -> None:
    for row in rec["eval"]:
        for k in ("length", "exact_match", "token_accuracy", "representable"):
            if k not in row:
                raise ValueError(f"eval row {row} is missing {k!r}")
        if not (0.0 <= row["exact_match"] <= 1.0 and 0.0 <= row["token_accuracy"] <= 1.0):
            raise ValueError(f"accuracies must lie in [0, 1], got {row}")


#: what a result file holds; fields added to the configuration later read as their defaults in older records
RECORDS = runner.Schema(SCHEMA, ("schema", "pe", "seed", "profile", "config", "num_parameters", "train", "eval"),
                        check=_check_rows, added_defaults=ADDED_DEFAULTS)


def check_record(rec: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``rec`` is a complete result record (:data:`RECORDS`)."""
    why = RECORDS.problem(rec)
    if why is not None:
        raise ValueError(f"result record is not a {SCHEMA} record: {why}")


def train_and_write(pe: str, cfg: ExtrapolationConfig, seed: int, out: str | Path, progress: bool) -> str:
    """Train, evaluate and write one result file; returns a one-line report (also the worker of ``--jobs``)."""
    rec = run_one(pe, cfg, seed, progress=progress)
    check_record(rec)
    atomic_write_json(result_path(out, pe, seed), rec)
    acc = " ".join(f"{r['length']}:{r['exact_match']:.2f}" for r in rec["eval"])
    return (f"done {pe} seed {seed}: {rec['train']['steps']} updates (mastered: {rec['train']['mastered']}), "
            f"train {rec['train']['seconds']} s, eval {rec['eval_seconds']} s, "
            f"final loss {rec['train']['final_loss']:.3f}, exact match by length {acc}")  # fmt: skip


def pending(cfg: ExtrapolationConfig, pes: Sequence[str], seeds: Sequence[int], out: str | Path) -> list[tuple[str, int]]:
    """The (scheme, seed) pairs without a finished result in ``out``.

    A finished file counts only if it was made with the same configuration; a file from another configuration,
    or a damaged one, raises ``ValueError`` (:func:`runner.finished`).
    """
    return [(pe, seed) for pe in (run_name(p) for p in pes) for seed in seeds
            if not runner.finished(result_path(out, pe, seed), RECORDS, asdict(cfg))]


def run_all(cfg: ExtrapolationConfig, pes: Sequence[str], seeds: Sequence[int], out: str | Path, *,
            progress: bool = True, jobs: int = 1, log=print) -> list[Path]:  # fmt: skip
    """Run every (scheme, seed) not already finished in ``out`` (:func:`runner.run_grid`); returns the paths of
    all results.

    ``jobs > 1`` trains that many models at once in worker processes (each with
    ``cfg.threads`` torch threads: tiny models use one core per process better than
    two threads in one process); each worker writes its own file as it finishes.  Ctrl-C stops every
    worker at once; the finished files are kept and a rerun skips them.
    """
    jobs = check_positive_int("jobs", jobs)
    seeds = list(dict.fromkeys(int(s) for s in seeds))  # a scheme or seed named twice is trained once
    pes = list(dict.fromkeys(run_name(p) for p in pes))
    # one process: a bar over each model's updates; worker processes: one bar over the models
    cells = [runner.Cell(result_path(out, pe, s), train_and_write, (pe, cfg, s, out, progress and jobs == 1))
             for pe in pes for s in seeds]  # fmt: skip
    runner.run_grid(cells, out=out, schema=RECORDS, config=asdict(cfg), jobs=jobs, log=log,
                    progress=progress and jobs > 1)
    return [result_path(out, pe, s) for pe in pes for s in seeds]


def load_results(out: str | Path) -> list[dict[str, Any]]:
    """Every result record in ``out`` (checked), sorted by the course's scheme order, then seed."""
    return sorted(runner.load_results(out, RECORDS), key=lambda r: (RUN_ORDER.index(r["pe"]), r["seed"]))


def pauses(folder: str | Path) -> dict[str, float]:
    """Seconds each model's training was paused, from ``folder/paused.json`` (keys: the record's path relative to
    ``folder``); empty when there is no such file.  A pause is recorded when training processes were stopped
    (SIGSTOP) while other work used the cores: their wall-clock ``train.seconds`` include it.  The file holds
    ``pauses``, a list of ``{"paused_seconds", "from", "to", "models"}``; an older file held one such pause at
    its top level, which is read the same way."""
    path = Path(folder) / "paused.json"
    if not path.is_file():
        return {}
    data = read_json(path)
    found: dict[str, float] = {}
    for pause in data.get("pauses", [data] if "paused_seconds" in data else []):
        for model in pause["models"]:
            found[model] = found.get(model, 0.0) + float(pause["paused_seconds"])
    return found


PAUSE_NOTE = ("training processes of these models were stopped (SIGSTOP) while other work used the cores, so their "
              "recorded train seconds include the pause; subtract it for their cost "
              "(posenc_lib.experiments.extrapolation.training_minutes does)")


def training_minutes(folder: str | Path) -> dict[str, float]:
    """Minutes of training per committed model under ``folder``, keyed by the record's path relative to it (records
    ``RUN_seedS.json`` at any depth: ``TASK/ARCH/`` as the budget runs write them): the cost of each model on one
    thread.  A record with ``train.cpu_seconds`` (the training process's CPU time, recorded since models were also
    trained at low priority beside other work) gives that; an older one its wall-clock ``train.seconds`` less any
    recorded pause (:func:`pauses`)."""
    folder = Path(folder)
    paused = pauses(folder)
    minutes = {}
    for path in sorted(folder.rglob("*_seed*.json")):
        key = path.relative_to(folder).as_posix()
        t = read_json(path)["train"]
        minutes[key] = (t["cpu_seconds"] if "cpu_seconds" in t else t["seconds"] - paused.get(key, 0.0)) / 60
    return minutes


def summarize(records: Sequence[dict[str, Any]], metric: str = "exact_match") -> dict[str, dict[str, list]]:
    """Per scheme: ``lengths``, ``mean``, ``min``, ``max`` over seeds, ``ci95`` (half-width of the 95%
    t-interval of the mean over seeds; nan for one seed), ``seeds`` and ``representable``."""
    check_choice("metric", metric, ("exact_match", "token_accuracy", "tf_token_accuracy"))
    by_pe: dict[str, list] = {}
    for r in records:
        by_pe.setdefault(r["pe"], []).append(r)
    summary = {}
    for pe, recs in by_pe.items():
        lengths = [row["length"] for row in recs[0]["eval"]]
        vals = torch.tensor([[row[metric] for row in r["eval"]] for r in recs], dtype=torch.float64)
        summary[pe] = {
            "lengths": lengths, "mean": vals.mean(0).tolist(), "min": vals.min(0).values.tolist(),
            "max": vals.max(0).values.tolist(), "seeds": sorted(r["seed"] for r in recs),
            "ci95": [interval95(vals[:, i].tolist())[1] for i in range(len(lengths))],
            "representable": [all(r["eval"][i]["representable"] for r in recs) for i in range(len(lengths))],
        }  # fmt: skip
    return summary


def whole_seeds(records: Sequence[dict[str, Any]], runs: Sequence[str]) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of the seeds that hold every one of ``runs`` (and only those runs' records), and those seeds:
    a comparison of means over different seed sets would mix seed luck into the ranking."""
    have: dict[int, set[str]] = {}
    for r in records:
        have.setdefault(r["seed"], set()).add(r["pe"])
    seeds = sorted(s for s, pes in have.items() if set(runs) <= pes)
    return [r for r in records if r["seed"] in seeds and r["pe"] in runs], seeds


def mastery_summary(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per run, from records trained with per-length mastery (``mastery_examples > 0``): ``runs`` (seeds),
    ``mastered`` (seeds whose every training length reached the threshold at the last check),
    ``first_mastered`` (per seed, the first checked update at which every length did; None where
    never) and ``weakest`` (per seed, ``[length, exact match]`` of its weakest training length at the end).
    """
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        t = r["train"]
        if t.get("mastery_by_length") is None:
            raise ValueError(f"{r['pe']} seed {r['seed']} was not judged per training length "
                             f"(profile {r['profile']!r}); use records of the budget profile")  # fmt: skip
        weakest = min(t["mastery_by_length"].items(), key=lambda kv: (kv[1], int(kv[0])))
        s = out.setdefault(r["pe"], {"runs": 0, "mastered": 0, "first_mastered": [], "weakest": []})
        s["runs"] += 1
        s["mastered"] += bool(t["mastered"])
        s["first_mastered"].append(t["first_mastered"])
        s["weakest"].append([int(weakest[0]), weakest[1]])
    return out


def position_profile(records: Sequence[dict[str, Any]], length: int,
                     key: str = "tf_position_accuracy") -> dict[str, list[float]]:  # fmt: skip
    """Per run: accuracy at each target position (``n`` symbols, then EOS) at test length ``length``,
    averaged over the seeds (``key``: ``tf_position_accuracy`` or the greedy ``position_accuracy``)."""
    check_choice("key", key, ("tf_position_accuracy", "position_accuracy"))
    by_pe: dict[str, list[list[float]]] = {}
    for r in records:
        row = next((row for row in r["eval"] if row["length"] == length), None)
        if row is None:
            raise ValueError(f"length {length} was not tested; tested: {[row['length'] for row in r['eval']]}")
        if key not in row:
            raise ValueError(f"{r['pe']} seed {r['seed']} has no {key!r} (made before it was recorded)")
        by_pe.setdefault(r["pe"], []).append(row[key])
    return {pe: torch.tensor(v, dtype=torch.float64).mean(0).tolist() for pe, v in by_pe.items()}


def paired_difference(records: Sequence[dict[str, Any]], run: str, other: str, length: int,
                      metric: str = "exact_match") -> dict[str, Any]:  # fmt: skip
    """``run`` minus ``other`` at test length ``length``, seed by seed (the same seed: the same training data
    and test set): ``seeds``, ``diffs``, ``mean``, ``ci95`` (half-width of the 95% t-interval of the mean
    difference; nan for one seed) and ``wins`` (seeds where ``run`` scored higher)."""
    check_choice("metric", metric, ("exact_match", "token_accuracy", "tf_token_accuracy"))
    runs = list(dict.fromkeys(r["pe"] for r in records))
    for name in (run, other):
        check_choice("run", name, runs)
    value = {}
    for r in records:
        if r["pe"] in (run, other):
            row = next((row for row in r["eval"] if row["length"] == length), None)
            if row is None:
                raise ValueError(f"length {length} was not tested; tested: {[row['length'] for row in r['eval']]}")
            value[r["pe"], r["seed"]] = row[metric]
    seeds = sorted({s for pe, s in value if pe == run})
    if seeds != sorted({s for pe, s in value if pe == other}):
        raise ValueError(f"{run} and {other} have different seeds ({seeds} and "
                         f"{sorted({s for pe, s in value if pe == other})}): a paired difference needs the same seeds")
    diffs = [value[run, s] - value[other, s] for s in seeds]
    mean, half = interval95(diffs)
    return {"seeds": seeds, "diffs": diffs, "mean": mean, "ci95": half, "wins": sum(d > 0 for d in diffs)}


def plot_position_accuracy(ax, profile: dict[str, list[float]], *, length: int, train_max_len: int,
                           task: str = "reverse") -> None:  # fmt: skip
    """Accuracy per target position at one test length (``profile`` from :func:`position_profile`), one line per
    run.  Shaded: the output positions no training sequence had (``t >= train_max_len``); for the reversal task
    the first outputs read the source positions beyond training (``n - 1 - t >= train_max_len``), marked too."""
    import matplotlib.pyplot as plt

    check_choice("task", task, TASKS)
    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.95, max(1, len(profile))).numpy())
    for k, ((pe, acc), c) in enumerate(zip(profile.items(), colors)):
        if len(acc) != length + 1:
            raise ValueError(f"{pe}: {len(acc)} positions, expected {length + 1} (n symbols and EOS) for length {length}")
        ax.plot(range(length + 1), acc, color=c, marker="o", ms=3, ls="-" if k % 2 == 0 else "--", label=pe)
    ax.axvspan(train_max_len - 0.5, length + 0.5, color="0.9", zorder=0, label="output positions beyond training")
    if task == "reverse" and length > train_max_len:
        ax.axvspan(-0.5, length - train_max_len - 0.5, color="mistyrose", zorder=0,
                   label="reads source positions beyond training")  # fmt: skip
    ax.set_xticks(list(range(0, length, 4)) + [length], [str(t) for t in range(0, length, 4)] + ["EOS"])
    ax.set_xlabel(f"target position (test length {length})")
    ax.set_ylabel("accuracy (fraction)")
    ax.set_ylim(-0.03, 1.03)


def plot_accuracy_vs_length(ax, summary: dict[str, dict[str, list]], *, train_max_len: int, metric: str,
                            band: str = "range") -> None:  # fmt: skip
    """Mean over seeds (line) and a band for every scheme: min-max over seeds (``band="range"``) or the 95%
    interval of the mean (``band="ci95"``, clipped to [0, 1]); the training range shaded."""
    import matplotlib.pyplot as plt

    check_choice("band", band, ("range", "ci95"))

    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.95, len(summary)).numpy())
    markers = "osD^vP*Xh<>"
    for k, ((pe, s), c) in enumerate(zip(summary.items(), colors)):
        ax.plot(s["lengths"], s["mean"], marker=markers[k % len(markers)], ms=4, color=c, label=pe,
                ls="-" if k % 2 == 0 else "--")  # fmt: skip
        if band == "range":
            low, high = s["min"], s["max"]
        else:
            half = [0.0 if math.isnan(h) else h for h in s["ci95"]]
            low = [max(0.0, m - h) for m, h in zip(s["mean"], half)]
            high = [min(1.0, m + h) for m, h in zip(s["mean"], half)]
        ax.fill_between(s["lengths"], low, high, color=c, alpha=0.15, lw=0)
        cannot = [n for n, ok in zip(s["lengths"], s["representable"]) if not ok]
        if cannot:
            ax.scatter(cannot, [0.0] * len(cannot), marker="x", s=40, color="crimson", zorder=5,
                       label=f"{pe}: cannot represent")  # fmt: skip
    ax.axvspan(0, train_max_len, color="0.85", zorder=0, label="training lengths")
    ax.set_xlabel("test sequence length (symbols)")
    ax.set_ylabel(metric.replace("_", " ") + " (fraction)")
    ax.set_ylim(-0.03, 1.03)


def plot_heatmap(ax, summary: dict[str, dict[str, list]], *, train_max_len: int, title: str = "",
                 band: str = "range", marked: Sequence[str] = ()) -> None:  # fmt: skip
    """Runs (rows) x test lengths (columns), the mean over seeds written in every cell.

    Rows named in ``marked`` get a dagger after their label (say, runs with a seed that did not master the
    training lengths); a name in ``marked`` that is not a row is a ``ValueError``.

    ``"--"`` marks a length the run cannot represent (a learned table without the row); a
    red line separates the training lengths (left) from the longer ones.  With more than one
    seed the cell also shows, in a smaller font and without leading zeros, the min-max range
    over seeds (``band="range"``: ``.06-.09``) or the half-width of the 95% interval of the mean
    (``band="ci95"``: ``±.05``), only where it is not zero, so that neighbouring cells stay legible.
    """
    import numpy as np

    check_choice("band", band, ("range", "ci95"))
    unknown = sorted(set(marked) - set(summary))
    if unknown:
        raise ValueError(f"marked names runs the summary does not have: {unknown}; its runs: {list(summary)}")

    def short(v: float) -> str:
        text = f"{v:.2f}"
        return text[1:] if text.startswith("0.") else text

    runs = list(summary)
    lengths = summary[runs[0]]["lengths"]
    grid = np.array([summary[r]["mean"] for r in runs], dtype=float)
    ax.imshow(grid, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for i, r in enumerate(runs):
        s = summary[r]
        for j, _ in enumerate(lengths):
            color = "white" if grid[i, j] > 0.6 else "black"
            if band == "range":
                second = f"{short(s['min'][j])}-{short(s['max'][j])}" if short(s["min"][j]) != short(s["max"][j]) else ""
            else:
                second = f"±{short(s['ci95'][j])}" if short(s["ci95"][j]) not in ("nan", ".00") else ""
            spread = s["representable"][j] and len(s["seeds"]) > 1 and bool(second)
            text = f"{s['mean'][j]:.2f}" if s["representable"][j] else "--"
            ax.text(j, i - (0.17 if spread else 0.0), text, ha="center", va="center", fontsize=7, color=color)
            if spread:
                ax.text(j, i + 0.22, second, ha="center", va="center", fontsize=5.5, color=color)
    inside = sum(n <= train_max_len for n in lengths)
    ax.axvline(inside - 0.5, color="crimson", lw=2)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    labels = [f"{r} ({len(summary[r]['seeds'])})" if len(summary[r]["seeds"]) > 1 else r for r in runs]
    ax.set_yticks(range(len(runs)), [f"{label} †" if r in marked else label for r, label in zip(runs, labels)])
    ax.set_xlabel(f"test length (symbols); left of the red line: trained (<= {train_max_len})")
    if title:
        ax.set_title(title)


# -- command line ---------------------------------------------------------------------------------
def all_runs(arch: str) -> list[str]:
    """Every run of :data:`RUN_ORDER` that differs from the others in ``arch``.

    A causal ALiBi sees only keys on one side, so ``alibi-split`` is ``alibi`` in a decoder-only model.
    """
    check_choice("arch", arch, ARCHS)
    return [r for r in RUN_ORDER if not (arch == "decoder" and r == "alibi-split") and r != "t5-wide"]


def parse_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list {text!r}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.extrapolation", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--pe", default="all", help="'all' or comma-separated names from " + ", ".join(RUN_ORDER))
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--out", default=None, help="folder for the result files (default runs/extrapolation-PROFILE; "
                                               "the committed results are never the default)")
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes); default 1")
    p.add_argument("--arch", choices=ARCHS, default="encdec", help="encoder-decoder (default) or decoder-only LM")
    p.add_argument("--task", choices=TASKS, default=None, help="override the profile's task")
    p.add_argument("--unanchored", action="store_true", help="no </s> at the end of the source")
    p.add_argument("--lr", type=float, default=None, help="override the profile's peak learning rate (a sweep)")
    p.add_argument("--bias-lr-scale", type=float, default=None,
                   help="override the profile's learning-rate factor for score-bias tables (T5's)")
    p.add_argument("--steps", type=int, default=None,
                   help="override the profile's number of updates (its cap, with mastery stopping); the learning-rate "
                        "schedule decays over the new number")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    base = PROFILES[a.profile]
    try:
        cfg = replace(base, arch=a.arch, anchored=base.anchored and not a.unanchored, task=a.task or base.task,
                      lr=base.lr if a.lr is None else a.lr,
                      bias_lr_scale=base.bias_lr_scale if a.bias_lr_scale is None else a.bias_lr_scale,
                      steps=base.steps if a.steps is None else a.steps)  # fmt: skip
    except (TypeError, ValueError) as err:
        p.error(f"--lr/--bias-lr-scale/--steps: {err}")
    runs = f"valid choices: all, {', '.join(RUN_ORDER)} (or a scheme's alias)"
    if a.pe.strip().lower() == "all":
        pes = all_runs(cfg.arch)
    else:
        names = [t.strip() for t in a.pe.split(",") if t.strip()]
        if not names:
            p.error(f"--pe is empty ({a.pe!r}); {runs}")
        pes = []
        for name in names:  # every name, before any work
            try:
                pes.append(run_name(name))
            except (TypeError, ValueError):
                p.error(f"--pe: unknown run {name!r}; {runs}")
    try:
        seeds = parse_seed_list(a.seeds)
    except ValueError as err:
        p.error(str(err))
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    out = a.out or f"runs/extrapolation-{a.profile}"
    return runner.run_command(p, out, None, lambda: run_all(cfg, pes, seeds, out, progress=not a.no_progress,
                                                             jobs=a.jobs))

if __name__ == "__main__":
    sys.exit(main())
