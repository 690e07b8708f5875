"""Score-bias kernels the attention layer and the schemes share: relative positions (:func:`relative_positions`,
the one statement of the sign convention), a bias read from a table (:func:`table_bias`) or laid out along
diagonals (:func:`toeplitz_bias`, :func:`diagonal_sums`), and the masking of causal blocks (:func:`open_keys`,
:func:`fill_closed_`, :func:`consecutive`).

The rest of what this module held lives by purpose: argument checks in posenc_lib/checks.py, seeds in seeds.py,
files and folders in files.py, worker processes in pool.py, the command lines' pieces in cli.py, statistics in
stats.py.
"""
from __future__ import annotations

import torch


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``rel[i, j] = k_pos[j] - q_pos[i]`` (key minus query), shape ``(q_len, k_len)``."""
    return k_pos[None, :] - q_pos[:, None]


def table_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A score bias read from a table of per-distance values: ``(n, heads)`` ``table`` and ``(q_len, k_len)``
    int64 rows ``index`` -> ``(1, heads, q_len, k_len)`` float32, ``bias[0, h, i, j] = table[index[i, j], h]``.

    One lookup instead of evaluating a function of the distance at every (query, key) pair; the gradient
    sums per table row (as T5's bucket table)."""
    return torch.nn.functional.embedding(index, table.float()).permute(2, 0, 1)[None]


def toeplitz_bias(values: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """A score bias that depends only on ``j - i``, from one row per offset: ``(q_len + k_len - 1, heads)``
    ``values`` -> ``(1, heads, q_len, k_len)`` float32, ``bias[0, h, i, j] = values[j - i + q_len - 1, h]``.

    Same values as :func:`table_bias` with ``index[i, j] = j - i + q_len - 1``, built as overlapping windows
    of one vector (``unfold``); the gradient is summed along each diagonal (:func:`diagonal_sums`) instead of
    through an index of ``q_len * k_len`` rows (the embedding backward of :func:`table_bias` sorts them)."""
    if values.shape[0] != q_len + k_len - 1:
        raise ValueError(f"values must have q_len + k_len - 1 = {q_len + k_len - 1} rows, got {values.shape[0]}")
    return _Toeplitz.apply(values.float().t().contiguous(), k_len)


#: :func:`diagonal_sums` of a tall gradient works through blocks of at most this many rows (a few MB of buffer)
DIAGONAL_ROWS = 128


def open_keys(allowed: torch.Tensor) -> int:
    """How many leading keys every row of the boolean ``allowed (..., rows, n)`` may see (read on the host): a
    causal block of queries sees every key before its first query, so only the keys after need a mask."""
    seen = allowed.reshape(-1, allowed.shape[-1]).view(torch.uint8).amin(0)  # 1 where every row sees the key
    return int(seen.argmin()) if int(seen.min()) == 0 else seen.numel()  # argmin: the first of the minima


def fill_closed_(t: torch.Tensor, allowed: torch.Tensor, value: float) -> torch.Tensor:
    """``t.masked_fill_(~allowed, value)`` that reads and writes only the keys from the first one some row may not
    see (:func:`open_keys`): a causal block of 128 queries fills 128 of its keys, not all of them.  One layer's 16
    ALiBi blocks at L = 2048, batch 1 were laid out in 2-3 ms instead of 3-16 ms; the whole training step, side by
    side with the library before (``benchmarks.side_by_side``, 3 rounds of 3 repeats): t5 1.37 -> 1.36, alibi 1.24
    -> 1.21, t5's rounds between 1.34 and 1.47, so the change is within the spread between runs."""
    c0 = open_keys(allowed) if allowed.shape[-1] == t.shape[-1] and allowed.device.type == "cpu" else 0  # no device read
    if c0 < t.shape[-1]:
        t[..., c0:].masked_fill_(~allowed[..., c0:], value)
    return t


def diagonal_sums(grad: torch.Tensor) -> torch.Tensor:
    """``(heads, rows, n) -> (heads, rows + n - 1)``: ``out[h, j - i + rows - 1] = sum of grad[h, i, j]`` along
    each diagonal (the gradient of a bias laid out from one value per offset ``j - i``).

    Each block of rows is copied into a zeroed ``(heads, block, block + n - 1)`` buffer through a view whose row
    stride is one less than the buffer's, which puts each diagonal in one column; a sum over rows finishes it."""
    h, rows, n = grad.shape
    out = grad.new_zeros(h, rows + n - 1)
    for start in range(0, rows, DIAGONAL_ROWS):
        end = min(start + DIAGONAL_ROWS, rows)
        r = end - start
        width = r + n - 1
        buf = grad.new_zeros(h, r, width)
        buf.as_strided((h, r, n), (r * width, width - 1, 1), r - 1).copy_(grad[:, start:end])
        out[:, rows - end : rows - end + width] += buf.sum(1)  # block rows start:end sit at offsets from rows - end
    return out


class _Toeplitz(torch.autograd.Function):
    """``window (heads, q_len + n - 1) -> (1, heads, q_len, n)``, ``out[0, h, i, j] = window[h, j - i + q_len - 1]``."""

    @staticmethod
    def forward(ctx, window, n: int):
        return window.unfold(-1, n, 1).flip(-2).contiguous()[None]

    @staticmethod
    def backward(ctx, grad):
        return diagonal_sums(grad[0]), None


def consecutive(pos: torch.Tensor) -> bool:
    """True when the 1-d host tensor ``pos`` is ``start, start + 1, ...`` (positions of one unbroken window)."""
    n = pos.numel()
    return n > 0 and int(pos[-1]) - int(pos[0]) == n - 1 and (n == 1 or bool((pos.diff() == 1).all()))


def renamed_keys_hook(renames: dict[str, str]):
    """A ``load_state_dict`` pre-hook that loads state dicts saved before submodules were renamed: each key
    ``old.<rest>`` of ``renames`` (under the module's prefix) becomes ``new.<rest>``."""

    def hook(module, state_dict, prefix, *args) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            rest = key[len(prefix):]
            for old, new in renames.items():
                if rest.startswith(old + "."):
                    state_dict[prefix + new + rest[len(old):]] = state_dict.pop(key)
                    break

    return hook
