"""The course's finale: four Transformers that differ only in positional encoding, on WMT14 fr<->en.

    python -m posenc_lib.wmt14 --profile {smoke,cpu,gpu} --pe none,sinusoidal,shaw,rope \\
        [--seeds 0,1] [--direction fr-en|en-fr] [--data-dir D] [--out runs/NAME] [--resume]

For each scheme and seed: train (train.py), translate both test sets, score
them (evaluate.py), and write ``MODEL/result.json`` as soon as that model is
done (a finished model is skipped on a rerun).  Then ``results.json`` collects
every model, adds sacreBLEU's paired bootstrap between schemes, and
``figures/`` gets the plots.  Under ``torchrun --nproc_per_node N`` training is
data-parallel; evaluation runs on rank 0.

Schemes: Vaswani et al. 2017 (sinusoidal, arXiv:1706.03762), Shaw et al. 2018
(relative, arXiv:1803.02155), Su et al. 2021 (RoPE, arXiv:2104.09864) and no
position information at all.  Taught in notebooks/12_wmt14_four_way.ipynb.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .data import load_wmt14
from .evaluate import bertscore_f1, bertscore_model, bleu_chrf, paired_bootstrap, shuffle_words, translate
from .schemes import PE_TYPES, canonical_pe
from .tokenizer import get_tokenizer
from .train import PROFILES, Profile, barrier, dist_info, get_profile, train_model
from .utils import atomic_torch_save, atomic_write_json, atomic_write_text, check_choice

DEFAULT_PES = ("none", "sinusoidal", "shaw", "rope")
DIRECTIONS = ("fr-en", "en-fr")
#: profile fields that only change evaluation; they may differ between sittings of one run
EVAL_FIELDS = ("eval_limit", "beam", "length_penalty", "bertscore", "bootstrap_samples")


def parse_pes(text: str) -> list[str]:
    """``"all"`` -> every scheme in PE_TYPES; else comma-separated names/aliases (validated)."""
    if text.strip().lower() == "all":
        return list(PE_TYPES)
    pes = [canonical_pe(p) for p in text.split(",") if p.strip()]
    if not pes:
        raise ValueError(f"no positional encoding given in {text!r}; valid choices: {', '.join(PE_TYPES)} or 'all'")
    return list(dict.fromkeys(pes))


def _log(msg: str) -> None:
    if dist_info()[0] == 0:
        print(msg, flush=True)


# -- data ------------------------------------------------------------------------------------------
def prepare_data(prof: Profile, run_dir: Path, *, direction: str = "fr-en", data_dir=None, source: str = "auto",
                 vocab=None, log=_log):
    """Load the splits, build (or load) the tokenizer, encode and filter the training pairs (cached)."""
    check_choice("direction", direction, DIRECTIONS)
    src_lang, tgt_lang = direction.split("-")
    pick = {"fr": 0, "en": 1}
    splits, where = load_wmt14(data_dir, source=source, max_train=prof.max_train_pairs)
    log(f"data: {where}")
    fr, en = splits["train"]
    bpe_lines = fr[:200_000] + en[:200_000]
    tok = get_tokenizer(prof.tokenizer, bpe_lines, vocab_size=prof.vocab_size, cache=run_dir / "tokenizer.json",
                        vocab=vocab)
    cache = run_dir / f"data-{direction}.pt"
    if cache.is_file():
        data = torch.load(cache, weights_only=False)
    else:
        src, tgt = tok.encode(splits["train"][pick[src_lang]]), tok.encode(splits["train"][pick[tgt_lang]])
        keep = [i for i in range(len(src)) if 0 < len(src[i]) <= prof.max_tokens and 0 < len(tgt[i]) <= prof.max_tokens]
        d_src = tok.encode(splits["newstest2013"][pick[src_lang]])
        d_tgt = tok.encode(splits["newstest2013"][pick[tgt_lang]])
        # validation pairs come from the training length range, so the curve tracks learning rather
        # than length extrapolation (lesson 12 scores longer sentences separately, by length bucket)
        ok = [i for i in range(len(d_src)) if 0 < len(d_src[i]) <= prof.max_tokens and 0 < len(d_tgt[i]) <= prof.max_tokens]
        if not ok:
            raise ValueError(f"no newstest2013 pair has <= max_tokens={prof.max_tokens} tokens on both sides")
        dev_idx = sorted(random.Random(0).sample(ok, min(prof.val_pairs, len(ok))))
        data = {
            "train": {"src": [src[i] for i in keep], "tgt": [tgt[i] for i in keep]},
            "dev": {"src": [d_src[i] for i in dev_idx], "tgt": [d_tgt[i] for i in dev_idx]},
            "stats": {"train_pairs_read": len(src), "train_pairs_kept": len(keep),
                      "train_target_tokens": sum(len(tgt[i]) + 1 for i in keep),
                      "dev_pairs": len(dev_idx), "source": where},
        }  # fmt: skip
        if dist_info()[0] == 0:
            atomic_torch_save(data, cache)
    log(f"tokenizer {tok.kind} ({tok.vocab_size} tokens); {data['stats']['train_pairs_kept']} of "
        f"{data['stats']['train_pairs_read']} training pairs have <= {prof.max_tokens} tokens on both sides")
    return tok, data, splits


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


def evaluate_model(model, tok, splits: dict, prof: Profile, direction: str, bert_spec: dict | None,
                   device: str = "cpu") -> tuple[dict, dict]:
    """Scores on both test sets (+ shuffled in-domain sources, BERTScore), samples, an attention map."""
    s, t = (0, 1) if direction == "fr-en" else (1, 0)
    lim = prof.eval_limit
    kw = dict(beam=prof.beam, alpha=prof.length_penalty, device=device)
    out, hyps = {}, {}
    for name in ("heldout", "newstest2014"):
        src, ref = splits[name][s][:lim], splits[name][t][:lim]
        t0 = time.perf_counter()
        hyp = translate(model, tok, src, **kw)
        res = bleu_chrf(hyp, ref)
        res.update(sentences=len(src), decode_s=round(time.perf_counter() - t0, 1))
        short = [i for i, ids in enumerate(tok.encode(src)) if len(ids) <= prof.max_tokens]
        if short and name == "newstest2014":
            sub = bleu_chrf([hyp[i] for i in short], [ref[i] for i in short])
            res["short_sources"] = {"max_tokens": prof.max_tokens, "sentences": len(short), "bleu": sub["bleu"],
                                    "chrf": sub["chrf"]}
        if name == "heldout":
            shuf = bleu_chrf(translate(model, tok, shuffle_words(src, 0), **kw), ref)
            res["shuffled_source"] = {"bleu": shuf["bleu"], "chrf": shuf["chrf"]}
        if bert_spec is not None:
            res["bertscore_f1"] = bertscore_f1(hyp, ref, bert_spec, device=device)
        out[name], hyps[name] = res, hyp
    src, ref = splits["heldout"][s][:lim], splits["heldout"][t][:lim]
    picks = [round(i * (len(src) - 1) / 4) for i in range(5)]
    samples = [{"source": src[i], "reference": ref[i], "hypothesis": hyps["heldout"][i]} for i in picks]
    lens = [len(x) for x in tok.encode(src)]
    pick = next((i for i, n in enumerate(lens) if 8 <= n <= 14), 0)
    return {"tests": out, "samples": samples, "attention": attention_map(model, tok, src[pick], device)}, hyps


# -- one run ---------------------------------------------------------------------------------------
def _check_config(run_dir: Path, config: dict) -> None:
    path = run_dir / "config.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diff = [k for k in config["profile"] if k not in EVAL_FIELDS and old["profile"].get(k) != config["profile"][k]]
        diff += [k for k in ("direction", "tokenizer_source") if old.get(k) != config.get(k)]
        if diff:
            raise ValueError(f"{run_dir} holds a run made with different settings ({', '.join(diff)}); "
                             "use a new --out folder or delete the old one")
    if dist_info()[0] == 0:
        atomic_write_json(path, config)


def hardware() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "world_size": dist_info()[1]}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def run(prof: Profile, pes: list[str], seeds: list[int], out: str | os.PathLike, *, direction: str = "fr-en",
        data_dir=None, source: str = "auto", vocab=None, resume: bool = False, device: str | None = None,
        progress: bool = True, stop_after: int | None = None, log=_log) -> dict | None:
    """Train and evaluate every (scheme, seed); returns the collected results (rank 0) or None."""
    pes = [canonical_pe(p) for p in pes]
    check_choice("direction", direction, DIRECTIONS)
    run_dir = Path(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    rank, world = dist_info()
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"
    config = {"profile": asdict(prof), "direction": direction, "tokenizer_source": str(vocab or prof.tokenizer),
              "hardware": hardware()}
    _check_config(run_dir, config)
    if rank == 0:
        tok, data, splits = prepare_data(prof, run_dir, direction=direction, data_dir=data_dir, source=source,
                                         vocab=vocab, log=log)
    barrier()
    if rank != 0:
        tok, data, splits = prepare_data(prof, run_dir, direction=direction, data_dir=data_dir, source=source,
                                         vocab=vocab, log=lambda m: None)
    tgt_lang = direction.split("-")[1]
    if rank == 0:
        for name in ("heldout", "newstest2014"):
            srcs, refs = splits[name][::-1] if tgt_lang == "fr" else splits[name]
            atomic_write_text(run_dir / f"src.{name}.txt", "".join(r + "\n" for r in srcs[: prof.eval_limit]))
            atomic_write_text(run_dir / f"ref.{name}.txt", "".join(r + "\n" for r in refs[: prof.eval_limit]))
    online = source != "files" and data["stats"]["source"].startswith("Hugging Face")
    bert_spec = bertscore_model(tgt_lang, online) if prof.bertscore else None
    if prof.bertscore and bert_spec is None:
        log(f"BERTScore skipped: no offline model for target language {tgt_lang!r}")
    for seed in seeds:
        for pe in pes:
            model_dir = run_dir / f"{pe}-seed{seed}"
            if (model_dir / "result.json").is_file():
                log(f"{model_dir.name}: finished earlier, skipped")
                continue
            log(f"training {model_dir.name} ({prof.name} profile, {prof.max_steps} updates)")
            tr = train_model(pe, seed, prof, data, tok, model_dir, resume=resume, device=device, progress=progress,
                             stop_after=stop_after, log=log)
            if not tr["finished"]:
                log(f"{model_dir.name}: stopped at update {tr['updates']}; rerun with --resume to continue")
                return None
            if rank == 0:
                log(f"{model_dir.name}: {tr['updates']} updates in {tr['wall_s']:.0f} s; evaluating")
                res, hyps = evaluate_model(tr["model"], tok, splits, prof, direction, bert_spec, device)
                for name, hyp in hyps.items():
                    atomic_write_text(model_dir / f"hyp.{name}.txt", "".join(h + "\n" for h in hyp))
                summary = {k: tr[k] for k in ("params", "updates", "wall_s", "tok_per_s", "epochs", "curve")}
                atomic_write_json(model_dir / "result.json", {"pe": pe, "seed": seed, **summary, **res})
                h = res["tests"]["heldout"]
                log(f"{model_dir.name}: in-domain BLEU {h['bleu']:.2f} chrF {h['chrf']:.2f} "
                    f"(shuffled source BLEU {h['shuffled_source']['bleu']:.2f})")
                collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction)  # usable at once
            barrier()
    if rank != 0:
        return None
    results = collect_results(run_dir, pes, seeds, bert_spec=bert_spec, direction=direction)
    save_figures(results, run_dir / "figures")
    log(f"results: {run_dir / 'results.json'}")
    return results


def collect_results(run_dir, pes, seeds, *, bert_spec=None, direction="fr-en") -> dict:
    """Gather every ``MODEL/result.json`` into ``results.json`` and add paired bootstrap p-values."""
    run_dir = Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    data = torch.load(run_dir / f"data-{direction}.pt", weights_only=False)
    models = {}  # every finished model in the folder, schemes in the course's order, then by seed
    found = [json.loads(p.read_text()) for p in run_dir.glob("*-seed*/result.json")]
    rank = {pe: i for i, pe in enumerate(list(pes) + [p for p in PE_TYPES if p not in pes])}
    for r in sorted(found, key=lambda r: (rank.get(r["pe"], 99), r["seed"])):
        models.setdefault(r["pe"], {})[str(r["seed"])] = r
    results = {"config": config, "data": data["stats"],
               "bertscore": {"model": bert_spec["name"], "num_layers": bert_spec.get("num_layers", "package default")}
               if bert_spec else None, "models": models,
               "paired_bootstrap": {}}
    seed = str(seeds[0])
    done = [pe for pe in models if seed in models[pe]]
    n = config["profile"]["bootstrap_samples"]
    digest = hashlib.sha256(repr(n).encode())  # the test's inputs: its systems, their outputs, its samples
    for pe in done:
        digest.update(pe.encode())
        for name in ("heldout", "newstest2014"):
            digest.update((run_dir / f"{pe}-seed{seed}" / f"hyp.{name}.txt").read_bytes())
    results["paired_bootstrap_inputs"] = digest.hexdigest()
    old = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").is_file() else {}
    if len(done) > 1 and old.get("paired_bootstrap_inputs") == results["paired_bootstrap_inputs"]:
        results["paired_bootstrap"] = old["paired_bootstrap"]  # same inputs as last time: not repeated
    elif len(done) > 1:
        for name in ("heldout", "newstest2014"):
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
    from .extrapolation import bleu_by_source_length

    check_choice("test", test, ("heldout", "newstest2014"))
    run_dir = Path(run_dir)
    need = [run_dir / f"src.{test}.txt", run_dir / f"ref.{test}.txt", run_dir / "results.json"]
    missing = [str(p) for p in need if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"bleu_by_length needs {', '.join(missing)} (written by python -m posenc_lib.wmt14)")
    results = json.loads((run_dir / "results.json").read_text())
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


# -- command line ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m posenc_lib.wmt14", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu", choices=list(PROFILES))
    ap.add_argument("--pe", default=",".join(DEFAULT_PES), help="comma-separated schemes or 'all'")
    ap.add_argument("--seeds", default="0", help="comma-separated integers")
    ap.add_argument("--direction", default="fr-en", choices=DIRECTIONS)
    ap.add_argument("--data-dir", default=None, help="folder with train/newstest2013/newstest2014[/heldout].{fr,en}")
    ap.add_argument("--source", default="auto", choices=["auto", "hub", "files"])
    ap.add_argument("--tokenizer", default=None, choices=["bpe", "mbert"])
    ap.add_argument("--vocab", default=None, help="mBERT vocab.txt (default: data/vocab/)")
    ap.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
    ap.add_argument("--out", default=None, help="run folder (default runs/wmt14-PROFILE)")
    ap.add_argument("--resume", action="store_true", help="continue unfinished models from their checkpoints")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        if "=" not in item:
            ap.error(f"--set needs FIELD=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k.strip()] = v.strip()
    if args.tokenizer:
        overrides["tokenizer"] = args.tokenizer
    if args.beam:
        overrides["beam"] = str(args.beam)
    try:
        prof = get_profile(args.profile, overrides)
        pes = parse_pes(args.pe)
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError as err:
        ap.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    try:
        run(prof, pes, seeds, args.out or f"runs/wmt14-{prof.name}", direction=args.direction,
            data_dir=args.data_dir, source=args.source, vocab=args.vocab, resume=args.resume,
            progress=not args.no_progress and sys.stderr.isatty(), stop_after=args.stop_after)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
