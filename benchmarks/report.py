"""Render the benchmark JSON as a markdown table (``table.md``) and a figure (``cost.png``)."""
from __future__ import annotations

import json
from pathlib import Path

from posenc_lib.files import atomic_write_text

#: targets (CPU, training-step ratio to ``none`` at length 256) the implementations aim for
TARGETS_256 = {"sinusoidal": 1.02, "rope": 1.10, "alibi": 1.15, "t5": 1.25, "shaw": 1.5, "xlnet": 1.7, "deberta": 1.9}
#: goals (CPU, training-step ratio to ``none`` at length 1024): the price of leaving the fused kernel
TARGETS_1024 = {"t5": 1.3, "alibi": 1.3, "shaw": 1.6, "deberta": 1.8, "xlnet": 2.0}
TARGET_SHAW_MEMORY = 1.3  # peak memory at the memory length, ratio to none (the goal for every scheme)
TARGET_CACHE_SPEEDUP = 7.0


#: the lengths at which the goals of ``TARGETS_1024`` and the memory goal are held for every batch size (``--batches``)
GOAL_LENGTHS = (512, 1024, 2048)


def load_results(out_dir: Path) -> dict:
    """The JSON files of a run folder by part: ``train``, ``memory``, ``decode`` and, from ``--batches``,
    ``train_batches``, ``memory_batches``."""
    res = {}
    for part in ("train", "memory", "decode", "train_batches", "memory_batches"):
        f = Path(out_dir) / f"{part}.json"
        if f.exists():
            res[part] = json.loads(f.read_text(encoding="utf-8"))
    return res


def batch_goals(res: dict) -> list[dict]:
    """One row per scheme with a goal, length and batch size measured with ``--batches``: the training-step
    ratio (goal ``TARGETS_1024``) and the peak-memory ratio (goal ``TARGET_SHAW_MEMORY``), each with ``met``
    (None where not measured).  Goals are held at the lengths of ``GOAL_LENGTHS``."""
    train = res.get("train_batches", {}).get("results", {}).get("batches", {})
    memory = res.get("memory_batches", {}).get("results", {}).get("batches", {})
    rows = []
    keys = sorted({(int(L), int(B)) for src in (train, memory) for B, r in src.items() for L in r["lengths"]})
    for L, B in keys:
        t = train.get(str(B), {}).get("lengths", {}).get(str(L), {})
        m = memory.get(str(B), {}).get("lengths", {}).get(str(L), {}).get("schemes", {})
        for pe, goal in TARGETS_1024.items():
            if pe not in t and pe not in m:
                continue
            time_ratio = t[pe]["ratio"] if pe in t else None
            mem_ratio = m[pe].get("ratio_peak") if pe in m else None
            held = L in GOAL_LENGTHS
            rows.append({
                "scheme": pe, "length": L, "batch": B, "time_ratio": time_ratio, "time_goal": goal,
                "time_met": None if time_ratio is None or not held else time_ratio <= goal,
                "memory_ratio": mem_ratio, "memory_goal": TARGET_SHAW_MEMORY,
                "memory_met": None if mem_ratio is None or not held else mem_ratio <= TARGET_SHAW_MEMORY,
            })  # fmt: skip
    return rows


def _batch_section(res: dict) -> list[str]:
    """Markdown of the ``--batches`` results: per scheme and length, the ratio at each batch size and its goal."""
    rows = batch_goals(res)
    if not rows:
        return []
    batches = sorted({r["batch"] for r in rows})
    doc = res.get("train_batches") or res.get("memory_batches")
    lines = ["## Across batch sizes: training step and peak memory, ratio to `none`", "", _provenance(doc), "",
             "Each cell: time ratio / peak-memory ratio (`-` not measured); `*` marks a missed goal. Goals at "
             f"L in {', '.join(map(str, GOAL_LENGTHS))}: time as in the column, peak memory <= {TARGET_SHAW_MEMORY}.",
             "", "| scheme | L | " + " | ".join(f"B={B}" for B in batches) + " | time goal | goals held |",
             "|---|---|" + "---|" * len(batches) + "---|---|"]  # fmt: skip
    for pe in TARGETS_1024:
        for L in sorted({r["length"] for r in rows if r["scheme"] == pe}):
            mine = {r["batch"]: r for r in rows if r["scheme"] == pe and r["length"] == L}
            cells = []
            for B in batches:
                r = mine.get(B)
                if r is None:
                    cells.append("")
                    continue
                t = _f(r["time_ratio"]) + ("*" if r["time_met"] is False else "") if r["time_ratio"] is not None else "-"
                m = _f(r["memory_ratio"]) + ("*" if r["memory_met"] is False else "") if r["memory_ratio"] is not None else "-"
                cells.append(f"{t} / {m}")
            verdicts = [v for r in mine.values() for v in (r["time_met"], r["memory_met"]) if v is not None]
            held = "n/a" if not verdicts else ("all" if all(verdicts) else f"{sum(verdicts)} of {len(verdicts)}")
            lines.append(f"| {pe} | {L} | " + " | ".join(cells) + f" | <= {TARGETS_1024[pe]} | {held} |")
    return lines + [""]


def _schemes(res: dict) -> list[str]:
    for part, key in (("train", None), ("memory", "schemes"), ("decode", "schemes")):
        if part in res:
            r = res[part]["results"]
            if part == "train":
                first = next(iter(r["lengths"].values()))
                return list(first)
            return list(r[key])
    return []


def _f(x, nd=2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _provenance(doc: dict) -> str:
    """Which run a part comes from (parts can be re-run separately): date, threads, load at start."""
    m = doc["machine"]
    load = m.get("load_average_at_start")
    load_txt = f", load average {load[0]:.1f} at start" if load else ""
    return f"*Measured {doc.get('created', '?')[:16].replace('T', ' ')} UTC, {m['torch_threads']} torch thread{'s' if m['torch_threads'] != 1 else ''}{load_txt}.*"


def render_table(res: dict) -> str:
    lines = ["# Cost of each positional encoding", ""]
    any_part = next(iter(res.values()), None)
    if any_part is None:
        return "# Cost of each positional encoding\n\nNo results yet: run `python -m benchmarks.run`.\n"
    m, c = any_part["machine"], any_part["config"]
    lines += [
        f"Machine: {m['cpu_model']}, {m['torch_threads']} torch threads, torch {m['torch']}, device {m['device']}"
        + (f" ({m['gpu']})" if m.get("gpu") else "") + f", dtype {c['dtype']}.",
        f"Model: d_model {c['d_model']}, {c['n_heads']} heads, {c['num_layers']}+{c['num_layers']} layers, "
        f"ff {c['dim_feedforward']}, vocab {c['vocab_size']}, dropout {c['dropout']}. "
        "Every figure: median of the timed repeats after warm-up, schemes interleaved round-robin; "
        "ratios are to `none` measured in the same run.",
        "",
    ]
    schemes = _schemes(res)
    if "train" in res:
        tr = res["train"]["results"]["lengths"]
        lengths = list(tr)
        head = "| scheme | " + " | ".join(f"L={L}" for L in lengths) + " | target at L=256 | goal at L=1024 |"
        lines += ["## Training step (forward + backward), ratio to `none`", "", head,
                  "|---|" + "---|" * len(lengths) + "---|---|"]  # fmt: skip
        lines[-2:-2] = [_provenance(res["train"]), ""]
        for pe in schemes:
            cells = [_f(tr[L][pe]["ratio"]) for L in lengths]
            t = TARGETS_256.get(pe)
            mark = ""
            if t is not None and "256" in tr:
                mark = f"<= {t} ({'met' if tr['256'][pe]['ratio'] <= t else 'missed'})"
            g, mark_1024 = TARGETS_1024.get(pe), ""
            if g is not None and "1024" in tr:
                mark_1024 = f"<= {g} ({'met' if tr['1024'][pe]['ratio'] <= g else 'missed'})"
            lines.append(f"| {pe} | " + " | ".join(cells) + f" | {mark} | {mark_1024} |")
        lines.append(
            "| *`none`, seconds per step* | " + " | ".join(_f(tr[L]["none"]["median_s"], 3) for L in lengths) + " | | |"
        )
        lines.append("")
    if "memory" in res:
        mr = res["memory"]["results"]
        lines += [f"## Peak memory of a training step at L={mr['length']} ({mr['measure']}), one process per scheme",
                  "", _provenance(res["memory"]), "",
                  "| scheme | peak MiB | ratio | step MiB | step ratio |", "|---|---|---|---|---|"]  # fmt: skip
        for pe, r in mr["schemes"].items():
            if "error" in r:
                lines.append(f"| {pe} | failed: {r['error']} | | | |")
                continue
            lines.append(f"| {pe} | {r['peak_mb']:.0f} | {_f(r.get('ratio_peak'))} | {r['step_mb']:.0f} | {_f(r.get('ratio_step'))} |")
        lines += ["", f"Target: peak ratio <= {TARGET_SHAW_MEMORY} for every scheme. `step` = peak minus the memory held "
                  "before the first step.", ""]
    lines += _batch_section(res)
    if "decode" in res:
        dr = res["decode"]["results"]["schemes"]
        c = res["decode"]["config"]
        lines += [f"## Greedy decoding, {c['decode_new_tokens']} new tokens, batch {c['decode_batch']}", "",
                  _provenance(res["decode"]), "",
                  ]  # fmt: skip
        compiled = all("speedup_compiled" in r for r in dr.values())
        fastest = all("speedup_fastest" in r for r in dr.values())  # runs before it was recorded lack the column
        fast_head, fast_rule = (" fastest over fastest |", "---|") if fastest else ("", "")
        if compiled:
            lines += ["| scheme | cache speed-up |" + fast_head + " compiled step: speed-up | compiling (s) | cached, ratio "
                      "to `none` | uncached, ratio to `none` | tokens identical (cached / compiled) |",
                      "|---|---|" + fast_rule + "---|---|---|---|---|"]
        else:
            lines += ["| scheme | cache speed-up |" + fast_head + " cached, ratio to `none` | uncached, ratio to `none` | "
                      "tokens identical |", "|---|---|" + fast_rule + "---|---|---|"]
        for pe, r in dr.items():
            same = "yes" if r["identical"] else "NO"
            fast = f" {r['speedup_fastest']:.1f}x |" if fastest else ""
            if compiled:
                same += " / " + ("yes" if r["identical_compiled"] else "NO")
                lines.append(f"| {pe} | {r['speedup']:.1f}x |{fast} {r['speedup_compiled']:.1f}x | {r['compile_s']:.0f} | "
                             f"{_f(r['ratio_cached'])} | {_f(r['ratio_uncached'])} | {same} |")
            else:
                lines.append(f"| {pe} | {r['speedup']:.1f}x |{fast} {_f(r['ratio_cached'])} | {_f(r['ratio_uncached'])} | "
                             f"{same} |")
        lines += ["", f"Goal: cached decoding >= {TARGET_CACHE_SPEEDUP:.0f}x faster than re-running the decoder"
                  + (" (the compiled step: `greedy_decode(compile=True)`; compiling is done once per scheme, before the "
                     "timed runs)." if compiled else "."), ""]
        if fastest:
            lines[-1:-1] = ["Fastest over fastest is the one column that is not of medians: the fastest uncached call "
                            "over the fastest cached one (outside load only adds time)."]
    return "\n".join(lines)


def render_figure(res: dict, path: Path) -> bool:
    """Write ``path``: three panels (training ratio per length, memory ratio, cache speed-up) for a run with
    ``train``, ``memory`` or ``decode`` JSON; for a run of the batch-size axis only, its two panels
    (:func:`batch_figure`).  False, and nothing written, if there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if any(part in res for part in ("train", "memory", "decode")):
        fig = _parts_figure(res)
    elif batch_goals(res):
        fig = batch_figure(res)
    else:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return True


def batch_figure(res: dict):
    """The ``--batches`` results as two panels of bars, one group per scheme with a goal and one bar per measured
    (length, batch size): the training-step ratio to ``none`` under each scheme's time goal, and the peak-memory
    ratio under the memory goal.  Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = batch_goals(res)
    schemes = [pe for pe in TARGETS_1024 if any(r["scheme"] == pe for r in rows)]
    shapes = sorted({(r["length"], r["batch"]) for r in rows})
    colors = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(shapes)))
    w = 0.8 / len(shapes)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5), constrained_layout=True)
    panels = (("time_ratio", "Training step (fwd + bwd) vs none", "time ratio to none"),
              ("memory_ratio", "Peak memory vs none", "memory ratio to none"))  # fmt: skip
    for ax, (key, title, ylabel) in zip(axes, panels):
        for i, shape in enumerate(shapes):
            mine = {r["scheme"]: r[key] for r in rows if (r["length"], r["batch"]) == shape}
            xs = [j + (i - (len(shapes) - 1) / 2) * w for j, pe in enumerate(schemes) if mine.get(pe) is not None]
            hs = [mine[pe] for pe in schemes if mine.get(pe) is not None]
            ax.bar(xs, hs, w, color=colors[i], label=f"L={shape[0]}, B={shape[1]}")
        for j, pe in enumerate(schemes):  # each scheme's goal over its group
            goal = TARGETS_1024[pe] if key == "time_ratio" else TARGET_SHAW_MEMORY
            ax.hlines(goal, j - 0.45, j + 0.45, color="firebrick", lw=1.2, label="goal" if j == 0 else None)
        ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
        ax.set(title=title, ylabel=ylabel, xticks=np.arange(len(schemes)))
        ax.set_xticklabels(schemes)
    axes[0].legend(fontsize=8, ncol=2 if len(shapes) > 6 else 1)
    doc = res.get("train_batches") or res.get("memory_batches")
    fig.suptitle(f"Across batch sizes ({doc.get('created', '?')[:10]}, {doc['machine']['torch_threads']} threads)")
    return fig


def _parts_figure(res: dict):
    """The three panels of :func:`render_figure` for a run with ``train``, ``memory`` or ``decode`` JSON."""
    import matplotlib.pyplot as plt
    import numpy as np

    schemes = _schemes(res)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), constrained_layout=True)
    x = np.arange(len(schemes))
    ax = axes[0]
    if "train" in res:
        tr = res["train"]["results"]["lengths"]
        colors = plt.get_cmap("viridis")(np.linspace(0.1, 0.85, len(tr)))
        w = 0.8 / len(tr)
        for i, (L, r) in enumerate(tr.items()):
            ax.bar(x + (i - (len(tr) - 1) / 2) * w, [r[pe]["ratio"] for pe in schemes], w, color=colors[i], label=f"L={L}")
        ax.legend(title="src = tgt length")
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set(title="Training step (fwd + bwd) vs none", ylabel="time ratio to none", xticks=x)
    ax.set_xticklabels(schemes, rotation=45, ha="right")
    ax = axes[1]
    if "memory" in res:
        mr = res["memory"]["results"]["schemes"]
        names = [pe for pe in mr if "ratio_peak" in mr[pe]]
        xm = np.arange(len(names))
        ax.bar(xm - 0.2, [mr[pe]["ratio_peak"] for pe in names], 0.4, color=plt.get_cmap("viridis")(0.3), label="process peak")
        ax.bar(xm + 0.2, [mr[pe]["ratio_step"] or 0 for pe in names], 0.4, color=plt.get_cmap("viridis")(0.75), label="step only")
        ax.set_xticks(xm)
        ax.set_xticklabels(names, rotation=45, ha="right")
        ax.legend()
        ax.set_title(f"Peak memory at L={res['memory']['results']['length']} vs none")
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set_ylabel("memory ratio to none")
    ax = axes[2]
    if "decode" in res:
        dr = res["decode"]["results"]["schemes"]
        names = list(dr)
        xs = np.arange(len(names))
        if all("speedup_compiled" in dr[pe] for pe in names):
            ax.bar(xs - 0.2, [dr[pe]["speedup"] for pe in names], 0.4, color=plt.get_cmap("viridis")(0.55), label="cached")
            ax.bar(xs + 0.2, [dr[pe]["speedup_compiled"] for pe in names], 0.4, color=plt.get_cmap("viridis")(0.85),
                   label="cached, compiled step")
        else:
            ax.bar(xs, [dr[pe]["speedup"] for pe in names], color=plt.get_cmap("viridis")(0.55))
        ax.axhline(TARGET_CACHE_SPEEDUP, color="0.3", lw=0.8, ls="--", label=f"goal {TARGET_CACHE_SPEEDUP:.0f}x")
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels(names, rotation=45, ha="right")
        ax.set_ylim(0, max(TARGET_CACHE_SPEEDUP, *(dr[pe].get("speedup_compiled", dr[pe]["speedup"]) for pe in names)) * 1.3)
        ax.legend(loc="upper left", ncol=3, fontsize=8)
        c = res["decode"]["config"]
        ax.set_title(f"Greedy decoding ({c['decode_new_tokens']} tokens): cache speed-up")
    ax.set_ylabel("uncached time / cached time")
    for ax, part in zip(axes, ("train", "memory", "decode")):
        if part not in res:  # a run of some parts only
            ax.text(0.5, 0.5, f"no {part}.json in this run", ha="center", va="center", transform=ax.transAxes,
                    color="0.4")
    return fig


def write_report(out_dir: Path) -> dict:
    res = load_results(out_dir)
    atomic_write_text(Path(out_dir) / "table.md", render_table(res))
    render_figure(res, Path(out_dir) / "cost.png")
    return res
