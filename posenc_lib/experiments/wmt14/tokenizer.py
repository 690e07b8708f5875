"""Subword tokenizers for the translation experiment: joint BPE (default) or mBERT WordPiece.

* ``bpe``: byte-pair encoding (Sennrich, Haddow & Birch 2016, "Neural Machine
  Translation of Rare Words with Subword Units", arXiv:1508.07909) learned
  jointly on the French and English training sentences with Hugging Face
  ``tokenizers``; ``▁`` marks a word start (Metaspace), so decoding restores the
  spacing exactly.  About 8k merges suit CPU-sized models.
* ``mbert``: the seed report's bert-base-multilingual-cased WordPiece vocabulary
  (119,547 entries; Devlin et al. 2019, arXiv:1810.04805), built offline from its
  ``vocab.txt`` with ``tokenizers.BertWordPieceTokenizer``.  (With transformers 5.x,
  ``BertTokenizerFast(vocab_file=...)`` silently yields a 5-token vocabulary; pass
  ``vocab=`` there, or use ``tokenizers`` directly as here.)  Its large output layer
  makes CPU training about 4x slower, which is why ``bpe`` is the default.

Ids 0..3 of the BPE vocabulary are ``<pad> <unk> <s> </s>``.  Used by
``python -m posenc_lib.experiments.wmt14``; taught in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from ...files import REPO_ROOT

#: the shipped mBERT vocabulary (see data/SOURCES.md)
MBERT_VOCAB = REPO_ROOT / "data" / "vocab" / "bert-base-multilingual-cased-vocab.txt"
TOKENIZERS = ("bpe", "mbert")


class SubwordTokenizer:
    """A thin wrapper: ``encode(list[str]) -> list[list[int]]``, ``decode(list[list[int]]) -> list[str]``."""

    def __init__(self, tok: Tokenizer, kind: str, pad: str, unk: str, bos: str, eos: str):
        self.tok, self.kind = tok, kind
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (tok.token_to_id(t) for t in (pad, unk, bos, eos))
        if None in (self.pad_id, self.bos_id, self.eos_id):
            raise ValueError(f"{kind} vocabulary lacks one of the special tokens {pad}, {bos}, {eos}")
        self.specials = {self.pad_id, self.bos_id, self.eos_id}

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(lines), add_special_tokens=False)]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Token ids (specials, padding and anything after ``</s>`` ignored) -> detokenized text."""
        clean = []
        for row in ids:
            row = [int(i) for i in row]
            if self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            clean.append([i for i in row if i not in self.specials])
        return [s.strip() for s in self.tok.decode_batch(clean, skip_special_tokens=True)]

    def tokens(self, line: str) -> list[str]:
        return self.tok.encode(line, add_special_tokens=False).tokens


def train_bpe(lines: list[str], vocab_size: int = 8000, path: str | os.PathLike | None = None) -> SubwordTokenizer:
    """Learn a joint BPE on ``lines`` (both languages); saved to ``path`` (tokenizer.json) if given."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
        limit_alphabet=300, show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(path) + ".tmp")
        tok.save(str(tmp))
        os.replace(tmp, path)
    return SubwordTokenizer(tok, "bpe", "<pad>", "<unk>", "<s>", "</s>")


def load_bpe(path: str | os.PathLike) -> SubwordTokenizer:
    """A BPE tokenizer saved by :func:`train_bpe`; a damaged file is a ``ValueError`` naming it."""
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 (tokenizers raises a bare Exception for a bad file)
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found") from None
        raise ValueError(f"tokenizer file {path} is unreadable ({' '.join(str(err).split())[:120]}); delete it: "
                         "it is trained again from the training data") from None
    return SubwordTokenizer(tok, "bpe", "<pad>", "<unk>", "<s>", "</s>")


def load_mbert(vocab: str | os.PathLike | None = None) -> SubwordTokenizer:
    """mBERT cased WordPiece from a local ``vocab.txt`` (``[PAD]`` 0, ``[CLS]`` as BOS, ``[SEP]`` as EOS)."""
    from tokenizers.implementations import BertWordPieceTokenizer

    path = Path(vocab) if vocab is not None else MBERT_VOCAB
    if path.is_dir():
        raise ValueError(f"mBERT vocabulary {path} is a folder; pass --vocab the vocab.txt file inside it")
    if not path.is_file():
        raise FileNotFoundError(
            f"mBERT vocabulary {path} not found; pass --vocab PATH to bert-base-multilingual-cased's vocab.txt "
            "or use --tokenizer bpe"
        )
    try:
        wp = BertWordPieceTokenizer(str(path), lowercase=False, strip_accents=False)
    except Exception as err:  # noqa: BLE001 (tokenizers raises bare Exception and TypeError for a bad file)
        why = " ".join(str(err).split())[:120]
        raise ValueError(f"mBERT vocabulary {path} is not a WordPiece vocab.txt ({why}); it needs one UTF-8 token per "
                         "line, including [PAD], [UNK], [CLS] and [SEP]: pass --vocab bert-base-multilingual-cased's "
                         "vocab.txt or use --tokenizer bpe") from None
    if wp.get_vocab_size() < 1000:
        raise ValueError(f"{path} gave only {wp.get_vocab_size()} tokens; is it a WordPiece vocab.txt?")
    return SubwordTokenizer(wp._tokenizer, "mbert", "[PAD]", "[UNK]", "[CLS]", "[SEP]")


def get_tokenizer(kind: str, train_lines: list[str] | None = None, *, vocab_size: int = 8000,
                  cache: str | os.PathLike | None = None, vocab: str | os.PathLike | None = None) -> SubwordTokenizer:
    """``bpe``: load ``cache`` if it exists, else train on ``train_lines`` and save it; ``mbert``: from ``vocab``."""
    if kind not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {kind!r}; valid choices: {', '.join(map(repr, TOKENIZERS))}")
    if kind == "mbert":
        return load_mbert(vocab)
    if cache is not None and Path(cache).is_file():
        return load_bpe(cache)
    if not train_lines:
        raise ValueError("training a BPE tokenizer needs train_lines")
    return train_bpe(train_lines, vocab_size, cache)
