"""WMT14 French-English data: line-aligned files offline, the Hugging Face hub online.

A *data directory* holds one sentence per line, line *i* of ``X.fr`` being the
translation of line *i* of ``X.en``; each file may be plain, ``.xz`` or ``.gz``:

* ``train.{fr,en}``          training pairs (Europarl v7 in the shipped subset)
* ``newstest2013.{fr,en}``   dev set (validation loss), 3000 pairs
* ``newstest2014.{fr,en}``   official WMT14 test set (news), 3003 pairs
* ``heldout.{fr,en}``        in-domain test set: 2000 Europarl pairs never trained on

The course ships such a directory in ``data/wmt14-fr-en`` (see data/SOURCES.md);
``--data-dir`` points at any other with the same names.  A directory without
``heldout.*`` borrows the shipped one, and training pairs that share a side with
a held-out pair are always removed, so the in-domain test stays unseen.

Online, ``source="hub"`` streams ``datasets.load_dataset("wmt14", "fr-en")``
(Bojar et al. 2014, Findings of the 2014 Workshop on Statistical Machine
Translation).  Used by ``python -m posenc_lib.experiments.wmt14`` and notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import gzip
import lzma
import os
import zlib
from pathlib import Path

from ...utils import REPO_ROOT, check_positive_int

#: the shipped data directory (repository root / data / wmt14-fr-en)
SHIPPED_DIR = REPO_ROOT / "data" / "wmt14-fr-en"
SPLITS = ("train", "newstest2013", "newstest2014", "heldout")
LANGS = ("fr", "en")


def find_file(data_dir: str | os.PathLike, name: str) -> Path:
    """``data_dir/name`` or its ``.xz`` / ``.gz`` variant; ``FileNotFoundError`` naming what was tried."""
    base = Path(data_dir) / name
    tried = [base, base.with_name(base.name + ".xz"), base.with_name(base.name + ".gz")]
    for p in tried:
        if p.is_file():
            return p
    raise FileNotFoundError(
        f"missing data file {base} (also tried .xz and .gz); a data directory needs "
        f"{', '.join(f'{s}.fr/{s}.en' for s in SPLITS)} (heldout is optional), one sentence per line"
    )


def _raw_bytes(path: Path) -> bytes:
    """The decompressed bytes of ``path``; a damaged ``.xz``/``.gz`` file raises ``ValueError`` naming it."""
    opener = {".xz": lzma.open, ".gz": gzip.open}.get(path.suffix, open)
    try:
        with opener(path, "rb") as f:
            return f.read()
    except (EOFError, lzma.LZMAError, gzip.BadGzipFile, zlib.error) as err:
        kind = path.suffix.lstrip(".")
        raise ValueError(
            f"{path}: damaged {kind} file ({err}); it was probably cut off while downloading or copying: "
            f"re-create it, e.g. copy it again or compress the plain text with `{'xz' if kind == 'xz' else 'gzip'} -k`"
        ) from None


def read_lines(path: str | os.PathLike) -> list[str]:
    """All lines of a UTF-8 text file (plain, .xz or .gz), without line ends.

    Every problem is a ``ValueError`` naming the file (and the line where there is
    one): a damaged compressed file, bytes that are not UTF-8, an empty file, an
    empty or blank line.  A missing file raises ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing data file {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file (a data file holds one sentence per line)")
    raw = _raw_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {raw[err.start:err.start + 1]!r} at offset {err.start}); "
            "convert the file to UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the first sentence
    if not text.strip():
        raise ValueError(f"{path} is empty (expected one sentence per line)")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        if not line.strip():
            raise ValueError(
                f"{path}, line {i + 1}: empty line (every line must hold one sentence; "
                "remove the line together with the same line of the other language)"
            )
    return [line.rstrip("\r") for line in lines]


def read_parallel(data_dir: str | os.PathLike, split: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    """``(fr_lines, en_lines)`` of ``split``; ``ValueError`` if the two files differ in length."""
    if limit is not None:
        limit = check_positive_int("limit", limit)
    paths = [find_file(data_dir, f"{split}.{lang}") for lang in LANGS]
    fr, en = (read_lines(p) for p in paths)
    if len(fr) != len(en):
        longer = paths[0] if len(fr) > len(en) else paths[1]
        raise ValueError(
            f"{paths[0]} has {len(fr)} lines but {paths[1]} has {len(en)}: the two sides of a split must be "
            f"line-aligned (line {min(len(fr), len(en)) + 1} of {longer} has no translation)"
        )
    return (fr[:limit], en[:limit]) if limit else (fr, en)


def dedup_pairs(fr: list[str], en: list[str], exclude: tuple[list[str], list[str]] | None = None):
    """Drop repeated (fr, en) pairs (first kept) and pairs sharing either side with ``exclude``."""
    banned_fr = set(exclude[0]) if exclude else set()
    banned_en = set(exclude[1]) if exclude else set()
    seen, out_fr, out_en = set(), [], []
    for f, e in zip(fr, en):
        if (f, e) in seen or f in banned_fr or e in banned_en:
            continue
        seen.add((f, e))
        out_fr.append(f)
        out_en.append(e)
    return out_fr, out_en


def hub_available() -> bool:
    """False when the environment says offline (then the hub would fail anyway)."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True") and os.environ.get(
        "HF_DATASETS_OFFLINE", "0"
    ) not in ("1", "true", "True")


def _load_hub(max_train: int) -> dict[str, tuple[list[str], list[str]]]:
    import datasets

    def pairs(split, limit=None):
        ds = datasets.load_dataset("wmt14", "fr-en", split=split, streaming=True)
        fr, en = [], []
        for ex in ds:
            t = ex["translation"]
            if t["fr"].strip() and t["en"].strip():
                fr.append(t["fr"].strip())
                en.append(t["en"].strip())
            if limit and len(fr) >= limit:
                break
        return fr, en

    return {"train": pairs("train", max_train), "newstest2013": pairs("validation"), "newstest2014": pairs("test")}


def load_wmt14(
    data_dir: str | os.PathLike | None = None, *, source: str = "auto", max_train: int | None = None
) -> tuple[dict[str, tuple[list[str], list[str]]], str]:
    """Load every split as ``{split: (fr_lines, en_lines)}`` and a one-line description of the source.

    ``source``: ``"auto"`` (the hub when reachable and no ``data_dir`` is given, else files),
    ``"hub"`` or ``"files"``.  Training pairs are deduplicated and never share a side with
    the held-out set.
    """
    if source not in ("auto", "hub", "files"):
        raise ValueError(f"unknown data source {source!r}; valid choices: 'auto', 'hub', 'files'")
    if max_train is not None:
        max_train = check_positive_int("max_train", max_train)
    splits, where, why = None, None, ""
    if source == "files":
        why = " (--source files)"
    elif source == "auto" and data_dir is not None:
        why = " (--data-dir given)"
    elif source == "auto" and not hub_available():
        why = " (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set: hub not tried)"
    else:
        try:
            splits = _load_hub(max_train or 1_000_000)
            where = "Hugging Face hub: datasets.load_dataset('wmt14', 'fr-en') (streamed train subset)"
        except Exception as err:  # the hub is unreachable or the dataset moved
            if source == "hub":
                raise ConnectionError(
                    f"could not load wmt14 fr-en from the Hugging Face hub ({' '.join(str(err).split())}); "
                    "offline, use the shipped files: --source files, or --data-dir FOLDER"
                ) from err
            why = f" (Hugging Face hub unreachable: {type(err).__name__})"
    if splits is None:
        data_dir = Path(data_dir) if data_dir is not None else SHIPPED_DIR
        if not data_dir.exists():
            raise FileNotFoundError(f"data directory {data_dir} does not exist")
        if not data_dir.is_dir():
            raise ValueError(f"data directory {data_dir} is a file, not a folder")
        splits = {s: read_parallel(data_dir, s, max_train if s == "train" else None) for s in SPLITS[:3]}
        where = f"local files in {data_dir}{why}"
    hdir = data_dir if data_dir is not None and any(Path(data_dir).glob("heldout.fr*")) else SHIPPED_DIR
    splits["heldout"] = read_parallel(hdir, "heldout")
    n_raw = len(splits["train"][0])
    splits["train"] = dedup_pairs(*splits["train"], exclude=splits["heldout"])
    if not splits["train"][0]:
        raise ValueError(
            f"no training pairs left in {where}: all {n_raw} share a side with the held-out set in {hdir}"
        )
    where += f"; {n_raw} training pairs read, {len(splits['train'][0])} after dedup; held-out from {hdir}"
    return splits, where
