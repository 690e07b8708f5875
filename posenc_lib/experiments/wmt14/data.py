"""WMT14 French-English data: line-aligned files offline, the Hugging Face hub online.

A *data directory* holds one sentence per line, line *i* of ``X.fr`` being the
translation of line *i* of ``X.en``; each file may be plain, ``.xz`` or ``.gz``:

* ``train.{fr,en}``          training pairs (Europarl v7 in the shipped subset)
* ``newstest2013.{fr,en}``   dev set (validation loss), 3000 pairs
* ``newstest2014.{fr,en}``   official WMT14 test set (news), 3003 pairs
* ``heldout.{fr,en}``        in-domain test set: 2000 Europarl pairs never trained on

:func:`make_data` (``python -m posenc_lib.experiments.wmt14 make-data``) writes a larger one for a GPU
run from the 1M Europarl pairs.  The course ships such a directory in ``data/wmt14-fr-en`` (see data/SOURCES.md);
``--data-dir`` points at any other with the same names.  A directory without
``heldout.*`` borrows the shipped one, and training pairs that share a side with
a held-out pair are always removed, so the in-domain test stays unseen.

Online, ``source="hub"`` streams ``datasets.load_dataset("wmt14", "fr-en")``
(Bojar et al. 2014, Findings of the 2014 Workshop on Statistical Machine
Translation).  Used by ``python -m posenc_lib.experiments.wmt14`` and notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import gzip
import hashlib
import lzma
import math
import os
import random
import zlib
from pathlib import Path

from ...checks import check_positive_int
from ...files import LOCK_NAME, REPO_ROOT, FolderLock, atomic_write_json, atomic_write_text, one_line

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


def _has_file(data_dir: Path, name: str) -> bool:
    return any((data_dir / f"{name}{ext}").is_file() for ext in ("", ".xz", ".gz"))


def has_split(data_dir: str | os.PathLike, split: str) -> bool:
    """Whether ``data_dir`` holds either side of ``split``; a folder holding one side only is refused with a
    ``FileNotFoundError`` naming the missing half (it is never completed from the shipped files)."""
    data_dir = Path(data_dir)
    present = [lang for lang in LANGS if _has_file(data_dir, f"{split}.{lang}")]
    if len(present) == 1:
        missing = next(lang for lang in LANGS if lang not in present)
        raise FileNotFoundError(
            f"{data_dir} holds {find_file(data_dir, f'{split}.{present[0]}').name} but not {split}.{missing} (nor "
            f".xz/.gz): the two sides of a split come as a pair; add {split}.{missing} or remove the other half")
    return bool(present)


def check_data_dir(data_dir: str | os.PathLike, splits: tuple[str, ...] = SPLITS[:3]) -> Path:
    """Check that a ``--data-dir`` holds every file a run reads (both sides of ``splits``, and both or neither
    side of the optional held-out set) before any work; returns the folder."""
    data_dir = Path(data_dir)
    if not data_dir.exists():
        raise FileNotFoundError(f"data directory {data_dir} does not exist")
    if not data_dir.is_dir():
        raise ValueError(f"data directory {data_dir} is a file, not a folder")
    for split in splits:
        if not has_split(data_dir, split):
            find_file(data_dir, f"{split}.{LANGS[0]}")  # names the file and what a data directory needs
    has_split(data_dir, "heldout")
    return data_dir


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
    r"""All lines of a UTF-8 text file (plain, .xz or .gz), without line ends (``\n`` or ``\r\n``).

    A carriage return or another line-break character inside a line becomes a space (see
    :func:`posenc_lib.utils.one_line`), so a sentence stays one line in every file written from it.

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
    if "\r" in text.rstrip("\r") and "\n" not in text.rstrip("\n"):
        raise ValueError(f"{path} ends its lines with carriage returns only (old Mac line ends); convert them, "
                         "e.g. `tr '\\r' '\\n' < FILE > FILE.new`")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        if not line.strip():
            raise ValueError(
                f"{path}, line {i + 1}: empty line (every line must hold one sentence; "
                "remove the line together with the same line of the other language)"
            )
    # a carriage return (or another character some reader takes for a line break) inside a sentence
    # would split it in two when the run folder's one-sentence-per-line files are read back, shifting
    # every later source against its reference: it becomes a space here, once, for every reader
    return [one_line(line.rstrip("\r")) for line in lines]


def read_parallel(data_dir: str | os.PathLike, split: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    """``(fr_lines, en_lines)`` of ``split``; ``ValueError`` if the two files differ in length."""
    if limit is not None:
        limit = check_positive_int("limit", limit)
    paths = [find_file(data_dir, f"{split}.{lang}") for lang in LANGS]
    fr, en = (read_lines(p) for p in paths)
    check_aligned(fr, en, *paths)
    return (fr[:limit], en[:limit]) if limit else (fr, en)


def out_of_step_at(longer: list[str], shorter: list[str]) -> int:
    """The 1-based line of ``longer`` where its extra lines most likely begin: the split point at which pairing
    line ``i`` with ``i`` before it, and ``i + extra`` with ``i`` after it, matches sentence lengths best."""
    d, n = len(longer) - len(shorter), len(shorter)

    def cost(x: str, y: str) -> float:
        return abs(math.log((1 + len(x)) / (1 + len(y))))  # a sentence and its translation have similar lengths

    before = [0.0]
    for i in range(n):
        before.append(before[-1] + cost(longer[i], shorter[i]))
    after = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        after[i] = after[i + 1] + cost(longer[i + d], shorter[i])
    return min(range(n + 1), key=lambda k: before[k] + after[k]) + 1


def check_aligned(fr: list[str], en: list[str], fr_name, en_name) -> None:
    """``ValueError`` if two sides of a split differ in length, naming both counts and the line near which they
    fall out of step (judged by sentence lengths), not only the end where one runs out."""
    if len(fr) == len(en):
        return
    (longer, name), (shorter, other) = sorted([(fr, fr_name), (en, en_name)], key=lambda t: -len(t[0]))
    k, extra = out_of_step_at(longer, shorter), len(longer) - len(shorter)
    raise ValueError(
        f"{fr_name} has {len(fr)} lines but {en_name} has {len(en)}: the two sides of a split must be line-aligned; "
        f"they fall out of step near line {k} of {name} (by sentence lengths, {'that line has' if extra == 1 else f'the {extra} lines from there have'} "
        f"no translation in {other}; the end of {other} is line {len(shorter)})")


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


def load_hub(max_train: int) -> dict[str, tuple[list[str], list[str]]]:
    """WMT14 fr-en from the Hugging Face hub (streamed): ``{split: (fr, en)}``, at most ``max_train`` training pairs."""
    import datasets

    def pairs(split, limit=None):
        ds = datasets.load_dataset("wmt14", "fr-en", split=split, streaming=True)
        fr, en = [], []
        for ex in ds:
            t = ex["translation"]
            f, e = one_line(t["fr"]).strip(), one_line(t["en"]).strip()
            if f and e:
                fr.append(f)
                en.append(e)
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
    splits, origin, why = None, None, ""
    if source == "files":
        why = " (--source files)"
    elif source == "auto" and data_dir is not None:
        why = " (--data-dir given)"
    elif source == "auto" and not hub_available():
        why = " (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set: hub not tried)"
    else:
        try:
            splits = load_hub(max_train or 1_000_000)
            origin = "Hugging Face hub: datasets.load_dataset('wmt14', 'fr-en') (streamed train subset)"
        except Exception as err:  # the hub is unreachable or the dataset moved
            if source == "hub":
                raise ConnectionError(
                    f"could not load wmt14 fr-en from the Hugging Face hub ({' '.join(str(err).split())}); "
                    "offline, use the shipped files: --source files, or --data-dir FOLDER"
                ) from err
            why = f" (Hugging Face hub unreachable: {type(err).__name__})"
    if splits is None:
        data_dir = check_data_dir(data_dir if data_dir is not None else SHIPPED_DIR)
        splits = {s: read_parallel(data_dir, s, max_train if s == "train" else None) for s in SPLITS[:3]}
        origin = f"local files in {data_dir}{why}"
    hdir = data_dir if data_dir is not None and has_split(data_dir, "heldout") else SHIPPED_DIR
    splits["heldout"] = read_parallel(hdir, "heldout")
    n_raw = len(splits["train"][0])
    splits["train"] = dedup_pairs(*splits["train"], exclude=splits["heldout"])
    if not splits["train"][0]:
        raise ValueError(
            f"no training pairs left in {origin}: all {n_raw} share a side with the held-out set in {hdir}"
        )
    origin += f"; {n_raw} training pairs read, {len(splits['train'][0])} after dedup; held-out from {hdir}"
    return splits, origin


# -- a larger training folder for the GPU (make-data) ----------------------------------------------
def make_data(src_dir, out_dir, *, pairs: int = 600_000, max_words: int = 50, seed: int = 2014, extra: bool = False,
              overwrite: bool = False, log=print) -> dict:
    """Write a ``--data-dir`` folder with ``pairs`` training pairs drawn from ``src_dir`` (e.g. the 1M
    Europarl pairs), plus newstest2013/2014 and the shipped held-out pairs.

    Never included in training: any pair sharing a side with newstest2013, newstest2014 or the
    held-out set, exact duplicates, empty sides, and pairs with more than ``max_words`` words on a
    side (at most ``max_tokens`` subwords fit in training anyway; dropping them keeps the folder
    small).  ``extra`` appends the newsdev 2008-2012 pairs of ``src_dir/extra`` (in-domain news).
    Files are xz-compressed and written via temporary files.  ``out_dir`` must be new or empty: a folder
    holding anything is refused (before the corpus is read) unless ``overwrite``; it is locked while written.
    """
    for name, v in (("pairs", pairs), ("max_words", max_words)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"make-data: {name} must be a positive integer, got {v!r}")
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if not src_dir.is_dir():
        raise FileNotFoundError(f"make-data: source folder {src_dir} does not exist")
    check_data_dir(src_dir, splits=("train",))  # and no half of a test pair (each is read from here when whole)
    for split in ("newstest2013", "newstest2014"):
        has_split(src_dir, split)
    if out_dir.resolve() == SHIPPED_DIR.resolve() or out_dir.resolve() == src_dir.resolve():
        raise ValueError(f"make-data: --out {out_dir} would overwrite its own input; choose a new folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"make-data: --out {out_dir} is a file; give a new folder")
    held = [p for p in sorted(out_dir.iterdir()) if p.name != LOCK_NAME] if out_dir.is_dir() else []
    if held and not overwrite:
        raise FileExistsError(f"make-data: --out {out_dir} already holds {held[0].name}"
                              f"{f' and {len(held) - 1} more' if len(held) > 1 else ''}; choose a new folder, or pass "
                              "--overwrite to replace its data files")
    with FolderLock(out_dir, what="--out folder", log=log):
        return _make_data_locked(src_dir, out_dir, pairs=pairs, max_words=max_words, seed=seed, extra=extra, log=log)


def _make_data_locked(src_dir: Path, out_dir: Path, *, pairs, max_words, seed, extra, log) -> dict:
    tests = {}
    for split in ("newstest2013", "newstest2014"):
        folder = src_dir if has_split(src_dir, split) else SHIPPED_DIR
        tests[split] = read_parallel(folder, split)
    tests["heldout"] = read_parallel(SHIPPED_DIR, "heldout")
    banned = (set().union(*(set(t[0]) for t in tests.values())), set().union(*(set(t[1]) for t in tests.values())))
    log(f"make-data: reading {find_file(src_dir, 'train.fr')} and train.en")
    fr, en = read_parallel(src_dir, "train")
    n_read = len(fr)
    fr, en = dedup_pairs(fr, en, exclude=banned)
    keep = [i for i in range(len(fr)) if len(fr[i].split()) <= max_words and len(en[i].split()) <= max_words]
    if len(keep) < pairs:
        raise ValueError(f"make-data: only {len(keep)} of the {n_read} pairs in {src_dir} qualify (<= {max_words} "
                         f"words a side, not in a test set, no duplicates); ask for --pairs {len(keep)} or fewer")
    pick = sorted(random.Random(seed).sample(keep, pairs))  # kept in corpus order
    train = ([fr[i] for i in pick], [en[i] for i in pick])
    n_extra = 0
    if extra:
        ex_fr = read_lines(find_file(src_dir / "extra", "newsdev2008-2012.fr"))
        ex_en = read_lines(find_file(src_dir / "extra", "newsdev2008-2012.en"))
        check_aligned(ex_fr, ex_en, f"{src_dir}/extra/newsdev2008-2012.fr", f"{src_dir}/extra/newsdev2008-2012.en")
        ex_fr, ex_en = dedup_pairs(ex_fr, ex_en, exclude=(banned[0] | set(train[0]), banned[1] | set(train[1])))
        n_extra = len(ex_fr)
        train = (train[0] + ex_fr, train[1] + ex_en)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"source": str(src_dir), "pairs_read": n_read, "pairs_qualifying": len(keep), "train_pairs": len(train[0]),
                "newsdev_pairs": n_extra, "max_words": max_words, "seed": seed, "files": {}}
    for lang, lines in zip(LANGS, train):
        path = out_dir / f"train.{lang}.xz"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
                f.write("".join(line + "\n" for line in lines))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        for stale in (out_dir / f"train.{lang}", out_dir / f"train.{lang}.gz"):  # only with overwrite=True
            stale.unlink(missing_ok=True)  # the loader would read an uncompressed file first
    for split, (t_fr, t_en) in tests.items():
        for lang, lines in zip(LANGS, (t_fr, t_en)):
            atomic_write_text(out_dir / f"{split}.{lang}", "".join(line + "\n" for line in lines))
    for p in sorted(out_dir.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.name != "MANIFEST.json":
            manifest["files"][p.name] = {"bytes": p.stat().st_size,
                                         "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    atomic_write_json(out_dir / "MANIFEST.json", manifest)
    size = sum(v["bytes"] for v in manifest["files"].values())
    log(f"make-data: {len(train[0])} training pairs ({n_extra} from newsdev) in {out_dir}, {size / 2**20:.1f} MiB")
    return manifest
