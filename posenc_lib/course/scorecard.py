"""The course's running scorecard: every position scheme against the requirements of lesson 01.

Lesson 01 lists six things a positional encoding should provide; every later lesson adds its scheme
to one table, with a short reason for each verdict and, where a property can be measured, a check
function that confirms the verdict. ``tests/test_scorecard.py`` runs every check, so a verdict the
code contradicts fails the tests.

A verdict's mark is ``"✓"`` (meets it), ``"✗"`` (fails it) or ``"~"`` (partly, see the reason).
A check returns ``True`` when the verdict's *claim* holds: for a ``"✗"`` verdict that is the failure
it states (for example "the norm grows with t").

Extending it: add one ``Entry(scheme, lesson, {requirement: Verdict(...)})`` to
``ENTRIES`` below (or call :func:`register` with it), giving a check function wherever the claim can be
measured on the library in well under a second, then end that lesson's summary with ``show(upto=LESSON)``.

Taught in notebooks/01_why_position.ipynb (the requirements); extended in the summaries of notebooks/02-10,
by xPos, Kerple, FIRE and CoPE in notebooks/11_beyond_the_classics.ipynb (which closes with the table of lessons
01-11), and by the two kinds of partial rotary of notebooks/15_rope_in_llms.ipynb, which shows the full table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

REQUIREMENTS: tuple[str, ...] = (
    "unique",
    "deterministic",
    "bounded",
    "consistent across lengths",
    "beyond training length",
    "relative distance readable",
)
"""Lesson 01's six requirements, in the order of its table."""

MARKS = ("✓", "✗", "~")


@dataclass(frozen=True)
class Verdict:
    """One cell of the scorecard: a mark, a short reason, and optionally a check of the claim."""

    mark: str
    reason: str
    check: Callable[[], bool] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.mark not in MARKS:
            raise ValueError(f"mark must be one of {MARKS}, got {self.mark!r}")
        if not self.reason:
            raise ValueError("a verdict needs a reason")


@dataclass(frozen=True)
class Entry:
    """One row of the scorecard: a scheme, the lesson that introduces it, and one verdict per requirement."""

    scheme: str
    lesson: int
    verdicts: dict[str, Verdict]

    def __post_init__(self):
        missing = [r for r in REQUIREMENTS if r not in self.verdicts]
        extra = [r for r in self.verdicts if r not in REQUIREMENTS]
        if missing or extra:
            raise ValueError(f"scheme {self.scheme!r}: verdicts must cover exactly {REQUIREMENTS}; "
                             f"missing {missing}, unknown {extra}")


# ---------------------------------------------------------------------------------------------
# Measurements shared by the checks (each is small: a few hundred positions at most)
# ---------------------------------------------------------------------------------------------

def is_unique(codes: torch.Tensor, tol: float = 1e-6) -> bool:
    """``True`` if no two rows of ``codes`` (``(L, dim)``) are within ``tol`` of each other."""
    if codes.dim() != 2:
        raise ValueError(f"codes must be (length, dim), got shape {tuple(codes.shape)}")
    dist = torch.cdist(codes.double(), codes.double())
    dist.fill_diagonal_(float("inf"))
    return bool(dist.min() > tol)


def max_norm_growth(code_fn: Callable[[int], torch.Tensor], short: int = 50, long: int = 500) -> float:
    """Largest code norm at length ``long`` divided by the largest at length ``short`` (1 = bounded)."""
    a, b = code_fn(short).double().norm(dim=-1).max(), code_fn(long).double().norm(dim=-1).max()
    return (b / a).item()


def same_across_lengths(code_fn: Callable[[int], torch.Tensor], lengths=(5, 50)) -> bool:
    """``True`` if position t gets the same code in a short and in a long sequence."""
    short, long = (code_fn(n) for n in lengths)
    return short.shape[-1] == long.shape[-1] and torch.allclose(short, long[: lengths[0]])


def toeplitz_error(gram: torch.Tensor) -> float:
    """Largest deviation of an ``(L, L)`` matrix from the mean of its diagonal (0 = depends on j - i only)."""
    n = gram.shape[0]
    return max((gram.diagonal(k) - gram.diagonal(k).mean()).abs().max().item() for k in range(-(n - 1), n))


def code_report(code_fn: Callable[[int], torch.Tensor], lengths=(5, 50)) -> dict:
    """Lesson 01's measurable rows for a code ``code_fn(L) -> (L, dim)``."""
    short, long = lengths
    return {
        "unique": is_unique(code_fn(long)),
        "deterministic": torch.equal(code_fn(short), code_fn(short)),
        "bounded (max norm)": round(code_fn(long).norm(dim=-1).max().item(), 4),
        "same across lengths": same_across_lengths(code_fn, lengths),
    }


# ---------------------------------------------------------------------------------------------
# The codes of the first lessons, as small functions of the length (the checks call them)
# ---------------------------------------------------------------------------------------------

def _integer(n):
    return torch.arange(n, dtype=torch.float64)[:, None]


def _normalised(n):
    return (torch.arange(n, dtype=torch.float64) / (n - 1))[:, None]


def _binary(n, n_bits=10):
    from ..schemes.absolute import binary_positions

    return binary_positions(n, n_bits=n_bits, dtype=torch.float64)


def _sinusoidal(n, dim=64):
    from ..schemes.sinusoidal import sinusoidal_encode

    return sinusoidal_encode(torch.arange(n, dtype=torch.float64), dim)


def _fresh_random(n):
    return torch.randn(n, 8, dtype=torch.float64)


_TABLE = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _fixed_table(n):
    return _TABLE[:n]


def _binary_hamming_follows_distance() -> bool:
    p = _binary(64, 6)
    ham = torch.cdist(p, p, p=1)
    return bool(ham[31, 32] == 6 and ham[0, 32] == 1)  # neighbours far apart, far positions close


def _sinusoidal_gram_is_toeplitz() -> bool:
    p = _sinusoidal(100)
    return toeplitz_error(p @ p.T) < 1e-9


def _sinusoidal_shift_is_linear() -> bool:
    from ..schemes.sinusoidal import sinusoidal_encode, sinusoidal_shift_matrix

    t = torch.arange(100, dtype=torch.float64)
    T = sinusoidal_shift_matrix(3, 64).double()
    return bool(((sinusoidal_encode(t, 64) @ T.T) - sinusoidal_encode(t + 3, 64)).abs().max() < 1e-6)


def _learned_table_refuses_beyond_max_len() -> bool:
    from ..schemes.absolute import LearnedPositionalEmbedding

    table = LearnedPositionalEmbedding(max_len=8, d_model=4)
    try:
        table(torch.arange(9))
    except ValueError:
        return True
    return False


def _learned_rows_distinct() -> bool:
    from ..schemes.absolute import LearnedPositionalEmbedding

    return is_unique(LearnedPositionalEmbedding(max_len=64, d_model=16).weight.detach())


def _shaw_index_clips() -> bool:
    from ..schemes.shaw import shaw_index

    pos = torch.arange(12)
    idx = shaw_index(pos, pos, 3)
    same_row_beyond_k = bool(idx[0, 4] == idx[0, 11])                       # 4 and 11 away: one row
    shifted = torch.equal(shaw_index(pos + 100, pos + 100, 3), idx)         # depends on j - i only
    return same_row_beyond_k and shifted and int(idx.max()) == 6


def _shaw_index_is_translation_invariant() -> bool:
    from ..schemes.shaw import shaw_index

    pos = torch.arange(10)
    return torch.equal(shaw_index(pos + 37, pos + 37, 4), shaw_index(pos, pos, 4))


def _rope_scores_relative() -> bool:
    from ..schemes.rotary import apply_rope

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(32, generator=g), torch.randn(32, generator=g)
    pos = torch.arange(40)
    s = apply_rope(q.expand(40, 32), pos) @ apply_rope(k.expand(40, 32), pos).T
    return toeplitz_error(s.double()) < 1e-3


def _rope_preserves_norm() -> bool:
    from ..schemes.rotary import apply_rope

    x = torch.randn(500, 32, generator=torch.Generator().manual_seed(1))
    return torch.allclose(apply_rope(x, torch.arange(500)).norm(dim=-1), x.norm(dim=-1), atol=1e-4)


def _rope_slow_pairs_unfinished_in_training() -> bool:
    from ..schemes.rotary import rope_frequencies

    # lesson 10's character LM: head_dim 16, base 10000, trained on 64 characters (distances up to 63)
    theta = rope_frequencies(16, 10000.0, torch.device("cpu")).double()
    unfinished = 63 * theta < 2 * math.pi                       # relative phase never completed a period
    new_at_512 = unfinished & (511 * theta > 2 * math.pi)        # ... but does within 512 characters
    return bool(unfinished.any() and not unfinished.all() and new_at_512.any())


def _shaw_all_rows_reached_from_length_k_plus_1() -> bool:
    from ..schemes.shaw import shaw_index

    def rows(n):
        pos = torch.arange(n)
        return set(shaw_index(pos, pos, 4).unique().tolist())
    return rows(4) != set(range(9)) and rows(5) == set(range(9))  # k = 4: the end rows need length k + 1


def _rope_distinguishes_positions() -> bool:
    from ..schemes.rotary import apply_rope

    x = torch.ones(200, 32)
    return is_unique(apply_rope(x, torch.arange(200)))


_EXTRAPOLATION = "defined there, but generalising there is a separate question (lesson 13)"

ENTRIES: list[Entry] = [
    Entry("integer t", 1, {
        "unique": Verdict("✓", "one number per position", lambda: is_unique(_integer(200))),
        "deterministic": Verdict("✓", "a fixed formula", lambda: torch.equal(_integer(9), _integer(9))),
        "bounded": Verdict("✗", "the code grows with t and swamps the word",
                           lambda: max_norm_growth(_integer) > 9),
        "consistent across lengths": Verdict("✓", "t does not depend on L", lambda: same_across_lengths(_integer)),
        "beyond training length": Verdict("✗", "longer inputs bring magnitudes never seen in training",
                                          lambda: max_norm_growth(_integer) > 9),
        "relative distance readable": Verdict("~", "only as a difference of magnitudes"),
    }),
    Entry("normalised t/(L-1)", 1, {
        "unique": Verdict("✓", "distinct within one sentence", lambda: is_unique(_normalised(200))),
        "deterministic": Verdict("✓", "a fixed formula", lambda: torch.equal(_normalised(9), _normalised(9))),
        "bounded": Verdict("✓", "always in [0, 1]", lambda: max_norm_growth(_normalised) == 1.0),
        "consistent across lengths": Verdict("✗", "position 1 gets 0.25 when L = 5, about 0.02 when L = 50",
                                             lambda: not same_across_lengths(_normalised)),
        "beyond training length": Verdict("✗", "the step between neighbours shrinks as L grows",
                                          lambda: not same_across_lengths(_normalised, (20, 40))),
        "relative distance readable": Verdict("✗", "one token apart means 1/(L-1): depends on L",
                                              lambda: not same_across_lengths(_normalised)),
    }),
    Entry("random per sentence", 1, {
        "unique": Verdict("✓", "random vectors almost never coincide"),
        "deterministic": Verdict("✗", "a new code every time: nothing to learn",
                                 lambda: not torch.equal(_fresh_random(5), _fresh_random(5))),
        "bounded": Verdict("✓", "norm about sqrt(dim)"),
        "consistent across lengths": Verdict("✗", "not even consistent with itself",
                                             lambda: not same_across_lengths(_fresh_random)),
        "beyond training length": Verdict("✗", "meaningless at every length"),
        "relative distance readable": Verdict("✗", "no structure at all"),
    }),
    Entry("fixed random table", 1, {
        "unique": Verdict("✓", "random rows are distinct", lambda: is_unique(_fixed_table(64))),
        "deterministic": Verdict("✓", "the same table every time",
                                 lambda: torch.equal(_fixed_table(9), _fixed_table(9))),
        "bounded": Verdict("✓", "every row has about the same norm"),
        "consistent across lengths": Verdict("✓", "row t is row t", lambda: same_across_lengths(_fixed_table)),
        "beyond training length": Verdict("✗", "no row beyond the table (64 here)",
                                          lambda: _fixed_table(100).shape[0] == 64),
        "relative distance readable": Verdict("✗", "rows are unrelated to each other"),
    }),
    Entry("binary bits", 2, {
        "unique": Verdict("✓", "2^n codes for n bits", lambda: is_unique(_binary(1024))),
        "deterministic": Verdict("✓", "a fixed formula", lambda: torch.equal(_binary(9), _binary(9))),
        "bounded": Verdict("✓", "entries 0 or 1, at most sqrt(n) in norm",
                           lambda: max_norm_growth(_binary, 512, 1024) <= 1.06),
        "consistent across lengths": Verdict("✓", "at a fixed width", lambda: same_across_lengths(_binary)),
        "beyond training length": Verdict("✗", "defined up to 2^n, but high bits never set in training are "
                                               "untrained inputs", lambda: bool(_binary(16)[:, 4:].sum() == 0)),
        "relative distance readable": Verdict("✗", "Hamming distance: 31 and 32 differ in 6 bits, 0 and 32 in 1",
                                              _binary_hamming_follows_distance),
    }),
    Entry("sinusoidal", 3, {
        "unique": Verdict("✓", "within the longest wavelength (10000 * 2 pi)", lambda: is_unique(_sinusoidal(500))),
        "deterministic": Verdict("✓", "a fixed formula", lambda: torch.equal(_sinusoidal(9), _sinusoidal(9))),
        "bounded": Verdict("✓", "every code has norm sqrt(d/2)", lambda: max_norm_growth(_sinusoidal) < 1 + 1e-9),
        "consistent across lengths": Verdict("✓", "depends on t only", lambda: same_across_lengths(_sinusoidal)),
        "beyond training length": Verdict("~", _EXTRAPOLATION + ": exact match 1.0 at length 16, 0.0 at 20",
                                          lambda: _sinusoidal(10_000).isfinite().all().item()),
        "relative distance readable": Verdict("✓", "PE(t+D) = T_D PE(t); PE(t).PE(t+D) depends on D only",
                                              lambda: _sinusoidal_shift_is_linear() and _sinusoidal_gram_is_toeplitz()),
    }),
    Entry("learned table", 4, {
        "unique": Verdict("✓", "random rows start distinct; training keeps them apart", _learned_rows_distinct),
        "deterministic": Verdict("✓", "fixed after training"),
        "bounded": Verdict("✓", "N rows of finite norm"),
        "consistent across lengths": Verdict("✓", "row t is row t"),
        "beyond training length": Verdict("✗", "no row beyond max_len (an error); rows never trained stay random, "
                                               "worse than no positions (lesson 04)",
                                          _learned_table_refuses_beyond_max_len),
        "relative distance readable": Verdict("~", "only if training builds it; no structure by design"),
    }),
    Entry("Shaw relative", 5, {
        "unique": Verdict("~", "offsets up to k are told apart; beyond k they share one row", _shaw_index_clips),
        "deterministic": Verdict("✓", "fixed tables after training"),
        "bounded": Verdict("✓", "2k+1 learned rows, whatever the length"),
        "consistent across lengths": Verdict("✓", "depends on j - i only", _shaw_index_is_translation_invariant),
        "beyond training length": Verdict("~", "every offset maps to a trained row if training reached length k + 1; "
                                               "whether the model generalises is task-dependent (lessons 05 and 13)",
                                          _shaw_all_rows_reached_from_length_k_plus_1),
        "relative distance readable": Verdict("✓", "the distance is the index", _shaw_index_is_translation_invariant),
    }),
    Entry("RoPE", 6, {
        "unique": Verdict("✓", "a rotation per position, distinct within the longest wavelength",
                          _rope_distinguishes_positions),
        "deterministic": Verdict("✓", "a fixed formula, no parameters"),
        "bounded": Verdict("✓", "a rotation keeps every norm", _rope_preserves_norm),
        "consistent across lengths": Verdict("✓", "the angle depends on t only"),
        "beyond training length": Verdict("~", _EXTRAPOLATION + "; slow pairs meet relative phases never seen in "
                                               "training", _rope_slow_pairs_unfinished_in_training),
        "relative distance readable": Verdict("✓", "scores depend on n - m only (key minus query)", _rope_scores_relative),
    }),
]


# -- lessons 07-10 ----------------------------------------------------------------------------

def _t5_far_distances_share_a_bucket() -> bool:
    from ..schemes.t5 import t5_relative_bucket

    b = t5_relative_bucket(torch.tensor([-3, -200, -5000, 3]), bidirectional=True)
    return bool(b[1] == b[2] and b[0] != b[3])          # 200 and 5000 alike; left and right told apart


def _t5_bias_is_translation_invariant() -> bool:
    from ..schemes.t5 import T5Bias

    bias = T5Bias(16, 2, 1)
    pos = torch.arange(30)
    return torch.equal(bias.compute_bias(pos, pos), bias.compute_bias(pos + 500, pos + 500))


def _t5_long_inputs_reach_new_buckets() -> bool:
    from ..schemes.t5 import t5_relative_bucket

    def used(n):
        p = torch.arange(n)
        return set(t5_relative_bucket(p[None, :] - p[:, None], True).unique().tolist())
    return len(used(512) - used(24)) > 0 and used(4096) == used(512)


def _xlnet_distance_codes_distinct_and_bounded() -> bool:
    from ..schemes.xlnet import xlnet_sinusoid

    r = xlnet_sinusoid(torch.arange(-500, 501).double(), 64)
    norms = r.norm(dim=-1)
    return is_unique(r) and bool((norms - norms[0]).abs().max() < 1e-9)


def _xlnet_scores_translation_invariant() -> bool:
    from ..attention.layer import MultiHeadAttention
    from ..schemes.registry import make_scheme

    scheme, attn = make_scheme("xlnet", 16, 2, 1), MultiHeadAttention(16, 2)
    x = torch.randn(1, 6, 16)
    w = [attn(x, scheme=scheme, prep=scheme.prepare(torch.arange(s, s + 6), torch.arange(s, s + 6)), need_weights=True)[1]
         for s in (0, 300)]
    return torch.allclose(w[0], w[1], atol=1e-6)


def _deberta_far_distances_share_rows() -> bool:
    from ..schemes.deberta import deberta_index

    idx = deberta_index(torch.tensor([0]), torch.tensor([0, 1, 2, 300, 3000]), 8, 8, 40)[0]
    return len(set(idx[:3].tolist())) == 3 and bool(idx[3] == idx[4])


def _deberta_index_translation_invariant() -> bool:
    from ..schemes.deberta import deberta_index

    pos = torch.arange(60)
    return torch.equal(deberta_index(pos, pos, 8, 8, 40), deberta_index(pos + 999, pos + 999, 8, 8, 40))


def _alibi_symmetric_in_encoder() -> bool:
    from ..schemes.alibi import alibi_bias, alibi_slopes

    b = alibi_bias(torch.arange(9), torch.arange(9), alibi_slopes(4))
    return torch.equal(b, b.transpose(-1, -2))                # left and right neighbours get one bias


def _alibi_penalty_grows_linearly() -> bool:
    from ..schemes.alibi import alibi_bias, alibi_slopes

    m = alibi_slopes(4)
    b = alibi_bias(torch.tensor([0]), torch.tensor([1000]), m)[0, :, 0, 0]
    return torch.allclose(b, -1000 * m)


def _alibi_long_bias_extends_short() -> bool:
    from ..schemes.alibi import alibi_bias, alibi_slopes

    m, short, long = alibi_slopes(8), torch.arange(16), torch.arange(64)
    return torch.equal(alibi_bias(long, long, m)[..., :16, :16], alibi_bias(short, short, m))


def _alibi_far_keys_get_negligible_prior() -> bool:
    from ..schemes.alibi import alibi_bias, alibi_slopes

    prior = torch.softmax(alibi_bias(torch.tensor([8191]), torch.arange(8192), alibi_slopes(8))[0, :, 0], -1)
    return bool(prior[:, : 8192 - 2048].sum(-1).max() < 1e-3)  # keys > 2048 back: < 0.1% of any head's prior


ENTRIES += [
    Entry("T5 bias", 7, {
        "unique": Verdict("~", "distances up to 7 exact, then log buckets; all beyond ~91 share one",
                          _t5_far_distances_share_a_bucket),
        "deterministic": Verdict("✓", "a learned table, fixed after training"),
        "bounded": Verdict("✓", "num_buckets x heads scalars, whatever the length"),
        "consistent across lengths": Verdict("✓", "depends on j - i only", _t5_bias_is_translation_invariant),
        "beyond training length": Verdict("~", "runs at any length, but longer inputs reach buckets never trained",
                                          _t5_long_inputs_reach_new_buckets),
        "relative distance readable": Verdict("✓", "the bucket of j - i (coarse when far)", _t5_bias_is_translation_invariant),
    }),
    Entry("Transformer-XL / XLNet", 8, {
        "unique": Verdict("✓", "a sinusoid per distance, distinct within its longest wavelength",
                          _xlnet_distance_codes_distinct_and_bounded),
        "deterministic": Verdict("✓", "a fixed sinusoid, learned W_R, u, v"),
        "bounded": Verdict("✓", "every R_(i-j) has the same norm", _xlnet_distance_codes_distinct_and_bounded),
        "consistent across lengths": Verdict("✓", "depends on i - j only", _xlnet_scores_translation_invariant),
        "beyond training length": Verdict("~", _EXTRAPOLATION + "; memories longer than in training are used",
                                          _xlnet_distance_codes_distinct_and_bounded),
        "relative distance readable": Verdict("✓", "(q_i + v).r_(i-j) reads the distance", _xlnet_scores_translation_invariant),
    }),
    Entry("DeBERTa", 9, {
        "unique": Verdict("~", "exact near 0, log buckets further; far distances share the edge rows",
                          _deberta_far_distances_share_rows),
        "deterministic": Verdict("✓", "a learned table, fixed after training"),
        "bounded": Verdict("✓", "2k rows per stack, whatever the length"),
        "consistent across lengths": Verdict("✓", "depends on i - j only", _deberta_index_translation_invariant),
        "beyond training length": Verdict("~", "only trained rows are reused, but edge rows never trained stay random",
                                          _deberta_far_distances_share_rows),
        "relative distance readable": Verdict("✓", "c2p and p2c read the bucketed distance", _deberta_index_translation_invariant),
    }),
    Entry("ALiBi", 10, {
        "unique": Verdict("~", "distances yes; the symmetric encoder form cannot tell left from right "
                               "unless an anchor token marks one end",
                          _alibi_symmetric_in_encoder),
        "deterministic": Verdict("✓", "a fixed slope per head, no parameters"),
        "bounded": Verdict("~", "the penalty grows linearly with distance, by design", _alibi_penalty_grows_linearly),
        "consistent across lengths": Verdict("✓", "the long bias extends the short one", _alibi_long_bias_extends_short),
        "beyond training length": Verdict("~", "perplexity stays flat, but far keys get almost no weight: "
                                               "a soft sliding window", _alibi_far_keys_get_negligible_prior),
        "relative distance readable": Verdict("✓", "-m_h |i - j| is the distance", _alibi_long_bias_extends_short),
    }),
]


# -- lesson 11: the schemes research keeps returning to -----------------------------------------

def _xpos_scores_relative() -> bool:
    from ..schemes.xpos import XPos

    scheme = XPos(32, 1, 1, causal=True)
    q, k = torch.randn(1, 1, 1, 32).expand(1, 1, 40, 32), torch.randn(1, 1, 1, 32).expand(1, 1, 40, 32)
    pos = torch.arange(40)
    rq, rk = scheme.rotate(q, k, scheme.prepare(pos, pos), 0)
    s = (rq @ rk.transpose(-1, -2))[0, 0]
    return torch.allclose(s[1:, 1:], s[:-1, :-1], atol=1e-4)  # every diagonal n - m holds one value


def _xpos_factors_explode_with_position() -> bool:
    from ..schemes.xpos import xpos_scales, xpos_zeta

    f = xpos_scales(torch.tensor([4095]), xpos_zeta(64), 512.0)
    return bool(f.min() < 1e-4 and (1 / f).max() > 1e4)  # query factors down to ~4e-5, key factors up to ~2e4


def _xpos_damps_far_keys() -> bool:
    from ..schemes.xpos import xpos_scales, xpos_zeta

    # the score factor of pair k between a query at m and a key r tokens back is zeta_k^(r / B) < 1, falling in r
    z = xpos_zeta(64)
    r = torch.tensor([0.0, 512.0, 4096.0])
    factor = xpos_scales(r, z, 512.0)
    return bool(torch.all(factor[1:] < factor[:-1]) and factor[-1].min() < 1e-3)


def _kerple_depends_on_distance_only() -> bool:
    from ..schemes.kerple import kerple_kernel

    r1, r2 = torch.tensor([0.5, 2.0]), torch.tensor([1.0, 0.3])
    i, j = torch.arange(30)[:, None], torch.arange(30)[None, :]
    b = kerple_kernel((i - j).abs(), r1, r2, "log")
    return torch.equal(b[1:, 1:], b[:-1, :-1])


def _kerple_log_grows_slowly() -> bool:
    from ..schemes.kerple import kerple_kernel

    r1, r2 = torch.tensor([1.0]), torch.tensor([1.0])
    b = kerple_kernel(torch.tensor([10.0, 100.0, 1000.0, 10000.0]), r1, r2, "log")[:, 0]
    steps = b[:-1] - b[1:]  # the extra penalty of each tenfold distance stays about log 10
    return bool(b.min() > -10 and torch.allclose(steps, torch.full_like(steps, math.log(10)), atol=0.1))


def _kerple_power_one_is_alibi() -> bool:
    from ..schemes.kerple import kerple_kernel

    r1 = torch.tensor([0.25, 0.0625])
    d = torch.arange(50.0)
    return torch.allclose(kerple_kernel(d, r1, torch.ones(2), "power"), -d[:, None] * r1)


def _fire_inputs_bounded() -> bool:
    from ..schemes.fire import fire_inputs

    pos = torch.arange(4096)
    x = fire_inputs(pos[-64:], pos, torch.tensor(0.1), torch.tensor(512.0))
    return bool(x.min() >= 0 and x.max() <= 1)  # at any length the MLP reads values in [0, 1]


def _fire_depends_on_query_position() -> bool:
    from ..schemes.fire import fire_inputs

    # the same distance (100) reads differently from a query at 1000 and one at 4000: normalised by psi(i)
    x = fire_inputs(torch.tensor([1000, 4000]), torch.tensor([900, 3900]), torch.tensor(0.1), torch.tensor(512.0))
    return bool(x[0, 0] > x[1, 1] + 0.05)


def _cope_counts_gated_units() -> bool:
    from ..schemes.cope import cope_positions

    # gates open only on keys marked as separators: the position counts separators, not tokens
    L, d = 12, 8
    marks = torch.zeros(L)
    marks[[2, 7, 10]] = 1.0
    q = torch.ones(1, 1, L, d)
    k = torch.zeros(1, 1, L, d)
    k[0, 0, :, 0] = 20 * marks - 10  # q.k = +-10*... : sigmoid near 1 on separators, near 0 elsewhere
    p = cope_positions(q, k, torch.arange(L), torch.arange(L), scale=1.0)[0, 0, L - 1]
    return bool(torch.allclose(p, torch.tensor([3.0] * 3 + [2.0] * 5 + [1.0] * 3 + [0.0]), atol=1e-3))


def _cope_positions_depend_on_content() -> bool:
    from ..schemes.cope import cope_positions

    q, pos = torch.randn(1, 1, 6, 8), torch.arange(6)
    a = cope_positions(q, torch.randn(1, 1, 6, 8), pos, pos, scale=1.0)
    b = cope_positions(q, torch.randn(1, 1, 6, 8), pos, pos, scale=1.0)
    return not torch.allclose(a, b)  # same token positions, other keys: other CoPE positions


def _cope_positions_bounded_by_tokens() -> bool:
    from ..schemes.cope import cope_positions

    L = 200
    p = cope_positions(torch.randn(1, 2, L, 8), torch.randn(1, 2, L, 8), torch.arange(L), torch.arange(L), 1.0)
    dist = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).clamp(min=-1) + 1  # keys j <= i: i - j + 1
    return bool(torch.all(p <= dist.float() + 1e-4) and p.min() >= 0)


ENTRIES += [
    Entry("xPos", 11, {
        "unique": Verdict("✓", "RoPE's rotation, scaled per pair", _xpos_scores_relative),
        "deterministic": Verdict("✓", "fixed rotation and decay, no parameters"),
        "bounded": Verdict("~", "scores are relative, but each factor zeta^(+-m/B) grows or shrinks with the "
                                "absolute position: blocks are centred near 0", _xpos_factors_explode_with_position),
        "consistent across lengths": Verdict("✓", "scores depend on n - m only", _xpos_scores_relative),
        "beyond training length": Verdict("~", "the built-in decay damps far keys (fast pairs most); new phases "
                                               "remain in slow pairs", _xpos_damps_far_keys),
        "relative distance readable": Verdict("✓", "as in RoPE, with a decay", _xpos_scores_relative),
    }),
    Entry("Kerple", 11, {
        "unique": Verdict("~", "one scalar per distance; the log kernel flattens, so far distances differ little",
                          _kerple_log_grows_slowly),
        "deterministic": Verdict("✓", "learned r1, r2 per head, fixed after training"),
        "bounded": Verdict("~", "the log kernel grows like log distance, the power kernel like d^r2",
                           _kerple_log_grows_slowly),
        "consistent across lengths": Verdict("✓", "depends on |i - j| only", _kerple_depends_on_distance_only),
        "beyond training length": Verdict("~", "a decaying prior like ALiBi's (power 1 is ALiBi), gentler for log",
                                          _kerple_power_one_is_alibi),
        "relative distance readable": Verdict("✓", "the kernel of |i - j|", _kerple_depends_on_distance_only),
    }),
    Entry("FIRE", 11, {
        "unique": Verdict("~", "a learned function of the normalised distance; one value may serve two pairs",
                          _fire_depends_on_query_position),
        "deterministic": Verdict("✓", "a learned MLP and c, L, fixed after training"),
        "bounded": Verdict("✓", "the MLP reads psi(i - j) / psi(max(i, L)) in [0, 1]", _fire_inputs_bounded),
        "consistent across lengths": Verdict("~", "past the threshold L a distance is read relative to the query's "
                                                  "own position", _fire_depends_on_query_position),
        "beyond training length": Verdict("~", "inputs stay in the range seen in training (progressive "
                                               "interpolation), but squeezed: a distance reads smaller",
                                          _fire_inputs_bounded),
        "relative distance readable": Verdict("~", "as a fraction of the query's position, beyond L",
                                              _fire_depends_on_query_position),
    }),
    Entry("CoPE", 11, {
        "unique": Verdict("~", "counts what the gates open on (words, sentences), so two tokens may share a "
                               "position", _cope_counts_gated_units),
        "deterministic": Verdict("~", "positions depend on the content through the gates",
                                 _cope_positions_depend_on_content),
        "bounded": Verdict("✓", "a position never exceeds the token distance, and the table is capped at max_pos",
                           _cope_positions_bounded_by_tokens),
        "consistent across lengths": Verdict("✓", "counts from the query back, whatever the length",
                                             _cope_counts_gated_units),
        "beyond training length": Verdict("~", "unit counts can stay in range when token counts do not; "
                                               "counts beyond max_pos are clipped", _cope_counts_gated_units),
        "relative distance readable": Verdict("✓", "in the units the gates count", _cope_counts_gated_units),
    }),
]


# -- lesson 15: partial rotary, two kinds ------------------------------------------------------

def _partial_codes(kind: str, n: int, head_dim: int = 32, fraction: float = 0.25) -> torch.Tensor:
    """Rotated all-ones vectors ``(n, head_dim)`` for NeoX partial rotary or p-RoPE (float64)."""
    from ..schemes.rope_scaling import scaled_rope_cos_sin
    from ..schemes.rope_spectrum import rotary_pairs
    from ..schemes.rotary import apply_rope_cos_sin

    pos, x = torch.arange(n), torch.ones(n, head_dim, dtype=torch.float64)
    if kind == "proportional":
        sc = {"rope_type": "proportional", "partial_rotary_factor": fraction}
        return apply_rope_cos_sin(x, *scaled_rope_cos_sin(pos, head_dim, 10000.0, False, sc), interleaved=False)
    r = 2 * rotary_pairs(fraction, head_dim)
    rot = apply_rope_cos_sin(x[:, :r], *scaled_rope_cos_sin(pos, r, 10000.0, False), interleaved=False)
    return torch.cat((rot, x[:, r:]), dim=-1)


def _partial_scores_relative(kind: str) -> bool:
    from ..schemes.registry import make_scheme

    options = ({"rotary_dim": 8} if kind == "neox" else
               {"scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.25}})  # fmt: skip
    scheme = make_scheme("rope", 32, 1, 1, causal=True, interleaved=False, **options)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 32, generator=g).expand(1, 1, 40, 32), torch.randn(1, 1, 1, 32, generator=g).expand(1, 1, 40, 32)
    pos = torch.arange(40)
    rq, rk = scheme.rotate(q, k, scheme.prepare(pos, pos), 0)
    return toeplitz_error((rq @ rk.transpose(-1, -2))[0, 0].double()) < 1e-3


def _prope_returns_close_to_earlier_positions() -> bool:
    full = (_partial_codes("proportional", 2, fraction=1.0)[1] - _partial_codes("proportional", 2, fraction=1.0)[0]).norm()
    c = _partial_codes("proportional", 2001)
    return bool((c[1:] - c[0]).norm(dim=-1).min() < full)  # some far position is nearer to 0 than full RoPE's neighbour


def _prope_kept_pairs_all_turn_within_64() -> bool:
    from ..schemes.rope_spectrum import partial_rotary_ladder

    lad = partial_rotary_ladder("proportional", 0.25, 128)
    return int(((63 * lad) >= 2 * math.pi).sum()) == int((lad > 0).sum()) == 16


def _neox_slow_pairs_stay_on_an_arc() -> bool:
    from ..schemes.rope_spectrum import partial_rotary_ladder

    lad = partial_rotary_ladder("neox", 0.25, 128)
    return int((8191 * lad >= 2 * math.pi).sum()) < int((lad > 0).sum())


def _partial_norm_kept(kind: str) -> bool:
    c = _partial_codes(kind, 500)
    return torch.allclose(c.norm(dim=-1), torch.full((500,), math.sqrt(32.0), dtype=torch.float64))


ENTRIES += [
    Entry("NeoX partial rotary", 15, {
        "unique": Verdict("✓", "its rotated pairs span every speed: distinct within their longest wavelength",
                          lambda: is_unique(_partial_codes("neox", 200))),
        "deterministic": Verdict("✓", "a fixed formula, no parameters"),
        "bounded": Verdict("✓", "a rotation keeps every norm", lambda: _partial_norm_kept("neox")),
        "consistent across lengths": Verdict("✓", "the angle depends on t only"),
        "beyond training length": Verdict("~", "like RoPE, its slow pairs meet relative phases never seen in "
                                               "training; the other dimensions never move",
                                          _neox_slow_pairs_stay_on_an_arc),
        "relative distance readable": Verdict("✓", "scores depend on n - m only (key minus query)",
                                              lambda: _partial_scores_relative("neox")),
    }),
    Entry("p-RoPE", 15, {
        "unique": Verdict("~", "distinct, but read from fast pairs only, which come back near earlier angles",
                          _prope_returns_close_to_earlier_positions),
        "deterministic": Verdict("✓", "a fixed formula, no parameters"),
        "bounded": Verdict("✓", "a rotation keeps every norm", lambda: _partial_norm_kept("proportional")),
        "consistent across lengths": Verdict("✓", "the angle depends on t only"),
        "beyond training length": Verdict("~", "every kept pair turns fully within a few dozen positions, so no angle "
                                               "is new; " + _EXTRAPOLATION, _prope_kept_pairs_all_turn_within_64),
        "relative distance readable": Verdict("✓", "scores depend on n - m only (fine distances only)",
                                              lambda: _partial_scores_relative("proportional")),
    }),
]


def register(entry: Entry) -> None:
    """Add a scheme's row (later lessons); a scheme name may appear only once."""
    if not isinstance(entry, Entry):
        raise TypeError(f"entry must be a scorecard.Entry, got {type(entry).__name__}")
    if any(e.scheme == entry.scheme for e in ENTRIES):
        raise ValueError(f"scheme {entry.scheme!r} is already on the scorecard; known: {[e.scheme for e in ENTRIES]}")
    ENTRIES.append(entry)


def entries(upto: int | None = None) -> list[Entry]:
    """The rows introduced in lessons ``<= upto`` (all rows if ``upto`` is None), in lesson order."""
    if upto is not None and (not isinstance(upto, int) or upto < 1):
        raise ValueError(f"upto must be a lesson number >= 1 or None, got {upto!r}")
    rows = [e for e in ENTRIES if upto is None or e.lesson <= upto]
    return sorted(rows, key=lambda e: e.lesson)


def run_checks(upto: int | None = None) -> dict[tuple[str, str], bool]:
    """Run every check of the rows up to lesson ``upto``: ``{(scheme, requirement): claim holds}``.

    The checks run seeded and inside ``torch.random.fork_rng``, so they give the same answer every time
    and leave the caller's random state untouched.
    """
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return {(e.scheme, r): bool(v.check()) for e in entries(upto) for r, v in e.verdicts.items()
                if v.check is not None}


def scorecard_markdown(upto: int | None = None, reasons: bool = True) -> str:
    """The scorecard as a Markdown table (schemes as rows). Checked verdicts carry a dagger (†)."""
    head = "| scheme | " + " | ".join(REQUIREMENTS) + " |"
    lines = [head, "|---" * (len(REQUIREMENTS) + 1) + "|"]
    for e in entries(upto):
        cells = []
        for r in REQUIREMENTS:
            v = e.verdicts[r]
            cell = v.mark + ("†" if v.check is not None else "")
            cells.append(f"{cell} {v.reason}" if reasons else cell)
        lines.append(f"| {e.scheme} (L{e.lesson:02d}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_LEGEND = "✓ meets it, ✗ fails it, ~ partly; † checked by code on every run (posenc_lib.course.scorecard.run_checks)."


def scorecard_html(upto: int | None = None, reasons: bool = True) -> str:
    """The scorecard as an HTML table (what a notebook and the course website display)."""
    from html import escape

    head = "".join(f"<th>{escape(r)}</th>" for r in ("scheme",) + REQUIREMENTS)
    rows = []
    for e in entries(upto):
        cells = [f"<td>{escape(e.scheme)} (L{e.lesson:02d})</td>"]
        for r in REQUIREMENTS:
            v = e.verdicts[r]
            mark = v.mark + ("†" if v.check is not None else "")
            cells.append(f"<td><b>{mark}</b> {escape(v.reason)}</td>" if reasons else f"<td>{mark}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="scorecard"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
            f"<p><small>{escape(_LEGEND)}</small></p>")


class ScorecardView:
    """What :func:`show` returns: displays as an HTML table, prints as the Markdown table."""

    def __init__(self, upto: int | None = None, reasons: bool = True):
        self.markdown = scorecard_markdown(upto, reasons) + "\n\n" + _LEGEND
        self.html = scorecard_html(upto, reasons)

    def _repr_html_(self) -> str:
        return self.html

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __repr__(self) -> str:
        return self.markdown


def show(upto: int | None = None, reasons: bool = True) -> ScorecardView:
    """The scorecard up to lesson ``upto`` after running its checks; raises if a check contradicts a verdict."""
    failed = [key for key, ok in run_checks(upto).items() if not ok]
    if failed:
        raise AssertionError(f"scorecard verdicts contradicted by their checks: {failed}")
    return ScorecardView(upto, reasons)
