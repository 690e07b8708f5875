"""The benchmark suite runs end to end in its tiny --quick configuration and writes what it promises."""
import json
from pathlib import Path

import pytest

from benchmarks.common import ALL_SCHEMES, NAIVE_SHAW, BenchConfig, ShawNaive, attention_settings, make_model, random_tokens
from benchmarks.run import SCHEMA, main


def _load(path):
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA
    for key in ("torch", "torch_threads", "cpu_model", "cores_available", "device"):
        assert key in doc["machine"]
    assert doc["config"]["d_model"] == BenchConfig.quick().d_model
    assert doc["attention_settings"] == attention_settings()  # what chose each call's computation
    return doc


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    common = ["--quick", "--threads", "1", "--out", str(out), "--quiet"]
    main(common + ["--only", "train,decode", "--lengths", "8,12", "--repeats", "2"])
    main(common + ["--only", "memory", "--schemes", "shaw"])
    return out


def test_training_results_cover_every_scheme_and_length(quick_run):
    doc = _load(quick_run / "train.json")
    lengths = doc["results"]["lengths"]
    assert list(lengths) == ["8", "12"]
    for res in lengths.values():
        assert set(res) == set(ALL_SCHEMES)
        assert res["none"]["ratio"] == 1.0
        for r in res.values():
            assert len(r["times_s"]) == 2 and r["min_s"] <= r["median_s"] <= r["max_s"]
            assert r["ratio"] == pytest.approx(r["median_s"] / res["none"]["median_s"])


def test_cached_and_uncached_decoding_give_identical_tokens(quick_run):
    doc = _load(quick_run / "decode.json")
    res = doc["results"]["schemes"]
    assert set(res) == set(ALL_SCHEMES)
    for pe, r in res.items():
        assert r["identical"], f"{pe}: cached and uncached greedy decoding differ"
        assert r["new_tokens"] == doc["config"]["decode_new_tokens"]
        assert r["speedup"] == pytest.approx(r["uncached"]["median_s"] / r["cached"]["median_s"])
        assert r["speedup_fastest"] == pytest.approx(r["uncached"]["min_s"] / r["cached"]["min_s"])
        assert r["speedup_fastest"] > 0


def test_memory_runs_one_process_per_scheme(quick_run):
    doc = _load(quick_run / "memory.json")
    res = doc["results"]["schemes"]
    assert list(res) == ["none", "shaw"]
    for r in res.values():
        assert "error" not in r, r
        assert r["peak_mb"] > 50 and r["peak_mb"] >= r["step_mb"] >= 0
    assert res["none"]["ratio_peak"] == 1.0


def test_table_and_figure_are_written(quick_run):
    table = (quick_run / "table.md").read_text()
    for heading in ("Training step", "Peak memory", "Greedy decoding"):
        assert heading in table
    assert "| shaw_naive |" in table and "NO |" not in table
    assert (quick_run / "cost.png").stat().st_size > 1000


def test_naive_shaw_is_the_same_function_as_shaw():
    cfg = BenchConfig.quick()
    fast, naive = make_model("shaw", cfg).eval(), make_model(NAIVE_SHAW, cfg).eval()
    assert isinstance(naive.enc_scheme, ShawNaive) and not isinstance(fast.enc_scheme, ShawNaive)
    src, tgt = random_tokens(cfg, 2, 9, seed=1), random_tokens(cfg, 2, 7, seed=2)
    import torch

    torch.testing.assert_close(naive(src, tgt), fast(src, tgt), atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_rejected(capsys):
    for argv, msg in ((["--schemes", "nonsense"], "unknown scheme"), (["--only", "speed"], "unknown part")):
        with pytest.raises(SystemExit) as exit_:
            main(["--quick", *argv, "--quiet"])
        assert exit_.value.code == 2 and msg in capsys.readouterr().err


def test_learned_table_covers_the_longest_benchmark_length():
    from dataclasses import replace

    import torch

    from benchmarks.common import BenchConfig, make_model

    cfg = replace(BenchConfig(), d_model=16, n_heads=2, num_layers=1, dim_feedforward=16, vocab_size=50,
                  lengths=(700,), memory_length=700)
    model = make_model("learned", cfg)
    with torch.no_grad():
        model.encode(torch.ones(1, 700, dtype=torch.long))


def test_worker_peak_memory_is_its_own_not_the_parents():
    """ru_maxrss survives fork+exec on Linux; the worker must report its own peak (VmHWM)."""
    import subprocess
    import sys

    ballast = b"\x01" * (1536 * 2**20)  # the parent touches 1.5 GiB before starting the worker
    code = "from benchmarks.memory import _peak_rss_mb; print(_peak_rss_mb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    del ballast
    assert float(out.stdout.strip()) < 1200, out.stdout


def test_decode_profile_splits_a_cached_step(tmp_path):
    """The decoding profile sorts every operator's own time into its categories; shares sum to one, and the
    vocabulary product is found by its shape."""
    from benchmarks.decode_profile import CATEGORIES, operator_category, main as profile_main

    doc = profile_main(["--quick", "--schemes", "none,shaw", "--threads", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "decode_profile.json").read_text()) == doc
    assert set(doc["results"]) == {"none", "shaw"}
    for r in doc["results"].values():
        assert tuple(r["shares"]) == CATEGORIES and abs(sum(r["shares"].values()) - 1) < 1e-9
        assert r["shares"]["output projection"] > 0 and r["shares"]["attention"] > 0 and r["ms_per_step"] > 0
    vocab = BenchConfig.quick().vocab_size
    assert operator_category("aten::mm", [[2, 32], [32, vocab]], vocab) == "output projection"
    assert operator_category("aten::mm", [[vocab, 32], [32, 2]], vocab) == "output projection"  # W x^T (few rows)
    assert operator_category("aten::mm", [[2, 32], [32, 5]], vocab) == "attention"
    assert operator_category("aten::addmm", [[32], [2, 32], [32, 32]], vocab) == "linear layers"
    # a packed weight (greedy_decode's cached loop on CPU): the output matrix or a linear layer
    assert operator_category("mkldnn::_linear_pointwise", [[2, 1, 32], [vocab, 32], [], [], [], []], vocab) == "output projection"
    assert operator_category("mkldnn::_linear_pointwise", [[2, 1, 32], [64, 32], [64], [], [], []], vocab) == "linear layers"
    assert operator_category("aten::linear", [[2, 32], [32, 32]], vocab) is None
    assert operator_category("aten::_scaled_dot_product_flash_attention_for_cpu", [], vocab) == "attention"
    # a compiled step: the machinery around the graph stays outside operators, the graph's own kernels are operators
    for machinery in ("TorchDynamo Cache Lookup", "Torch-Compiled Region: 0/1", "Pregraph bytecode"):
        assert operator_category(machinery, [], vocab) is None
    assert operator_category("## Call CompiledFxGraph fzegegx3ix ##", [], vocab) == "other operators"


def test_decode_profile_names_a_bad_scheme(tmp_path, capsys):
    from benchmarks.decode_profile import main as profile_main

    with pytest.raises(SystemExit) as e:
        profile_main(["--quick", "--schemes", "none,sinusoidl", "--out", str(tmp_path)])
    assert e.value.code == 2 and "sinusoidl" in capsys.readouterr().err
    assert not (tmp_path / "decode_profile.json").exists()


def test_check_schemes_accepts_lesson_11s_schemes_and_counts_each_once():
    from benchmarks.common import ALL_SCHEMES, VALID_SCHEMES, check_schemes
    from posenc_lib import SURVEY_TYPES

    assert check_schemes(["xpos", "cope", "xpos", " fire"]) == ("none", "xpos", "cope", "fire")
    assert set(SURVEY_TYPES) <= set(VALID_SCHEMES) and not set(SURVEY_TYPES) & set(ALL_SCHEMES)  # not in the default run
    with pytest.raises(ValueError, match="valid choices: .*kerple"):
        check_schemes(["xpoz"])


def test_batches_measure_train_and_memory_per_batch_size(tmp_path):
    """--batches: train_batches.json and memory_batches.json carry every batch size (memory at every length),
    table.md shows the ratio per batch size against the goals, and the single-batch files are not written."""
    from benchmarks.report import batch_goals, load_results

    out = tmp_path / "bench"
    common = ["--quick", "--threads", "1", "--out", str(out), "--quiet", "--schemes", "t5,shaw", "--lengths", "8,12"]
    main(common + ["--only", "train,memory", "--batches", "1,3", "--repeats", "1", "--warmup", "0"])
    assert sorted(p.name for p in out.glob("*.json")) == ["memory_batches.json", "train_batches.json"]
    train = _load(out / "train_batches.json")
    assert train["config"]["batches"] == [1, 3]
    assert list(train["results"]["batches"]) == ["1", "3"]
    for per_batch in train["results"]["batches"].values():
        assert list(per_batch["lengths"]) == ["8", "12"]
        assert per_batch["lengths"]["8"]["none"]["ratio"] == 1.0 and "shaw" in per_batch["lengths"]["8"]
    memory = _load(out / "memory_batches.json")
    for per_batch in memory["results"]["batches"].values():
        for L, res in per_batch["lengths"].items():
            assert res["length"] == int(L) and res["schemes"]["none"]["ratio_peak"] == 1.0
            assert "error" not in res["schemes"]["shaw"]
    rows = batch_goals(load_results(out))
    assert {(r["scheme"], r["length"], r["batch"]) for r in rows} == {
        (pe, L, B) for pe in ("t5", "shaw") for L in (8, 12) for B in (1, 3)}
    assert all(r["time_met"] is None for r in rows)  # goals are held at L = 512, 1024, 2048 only
    table = (out / "table.md").read_text()
    assert "Across batch sizes" in table and "| B=1 | B=3 |" in table and "| shaw | 12 |" in table
    assert (out / "cost.png").stat().st_size > 1000
    with pytest.raises(SystemExit):  # the batch files are replaced only with --overwrite
        main(common + ["--only", "train", "--batches", "1"])


def test_a_run_of_the_batch_axis_draws_its_bars_against_each_schemes_goal():
    """A folder with only train_batches.json / memory_batches.json gets a figure of those ratios (not empty panels
    of the single-batch parts): one bar per scheme and (length, batch), heights the JSON's ratios, each scheme's goal."""
    import matplotlib.pyplot as plt

    from benchmarks.report import TARGET_SHAW_MEMORY, TARGETS_1024, batch_figure, batch_goals, load_results

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "sides_B32_L2048"
    res = load_results(folder)
    assert set(res) == {"train_batches", "memory_batches"}
    rows = batch_goals(res)
    fig = batch_figure(res)
    try:
        time_ax, memory_ax = fig.axes
        for ax, key, goals in ((time_ax, "time_ratio", TARGETS_1024), (memory_ax, "memory_ratio", None)):
            heights = sorted(round(p.get_height(), 6) for p in ax.patches)
            assert heights == sorted(round(r[key], 6) for r in rows)
            schemes = [t.get_text() for t in ax.get_xticklabels()]
            assert schemes == [pe for pe in TARGETS_1024 if any(r["scheme"] == pe for r in rows)]
            lines = [c for c in ax.collections if c.get_label() == "goal" or c.get_label().startswith("_")]
            drawn = sorted(round(float(seg[0][1]), 6) for c in lines for seg in c.get_segments())
            want = [goals[pe] if goals else TARGET_SHAW_MEMORY for pe in schemes]
            assert drawn == sorted(want)
    finally:
        plt.close(fig)


def test_the_table_shows_the_compiled_step_where_the_run_timed_it():
    """benchmarks/results/batches was measured with --decode-compile: its table has the compiled step's speed-up,
    compile time and token check per scheme, and the 7x goal; a run without it keeps the plain columns."""
    import copy

    from benchmarks.report import TARGET_CACHE_SPEEDUP, load_results, render_table

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "batches"
    res = load_results(folder)
    table = render_table(res)
    assert "| scheme | cache speed-up | compiled step: speed-up | compiling (s) |" in table
    row = res["decode"]["results"]["schemes"]["deberta"]
    assert (f"| deberta | {row['speedup']:.1f}x | {row['speedup_compiled']:.1f}x | {row['compile_s']:.0f} |" in table
            and "yes / yes |" in table)
    assert f"Goal: cached decoding >= {TARGET_CACHE_SPEEDUP:.0f}x" in table and TARGET_CACHE_SPEEDUP == 7
    assert (folder / "table.md").read_text().strip() == table.strip()  # the committed table is this rendering
    plain = copy.deepcopy(res)
    for r in plain["decode"]["results"]["schemes"].values():
        for key in ("compiled", "speedup_compiled", "compile_s", "identical_compiled"):
            r.pop(key)
    assert "compiled step" not in render_table(plain) and "| scheme | cache speed-up | cached, ratio" in render_table(plain)


def test_the_decoding_table_shows_the_fastest_calls_where_the_run_recorded_them():
    """A run that records ``speedup_fastest`` gets a column for it (and the one line that says it is not of medians);
    the committed quiet-machine tables are this rendering."""
    from benchmarks.report import load_results, render_table

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "decode_quiet"
    for run in (folder, folder / "again", folder / "again_2"):
        res = load_results(run)
        table = render_table(res)
        assert "| scheme | cache speed-up | fastest over fastest | cached, ratio" in table
        assert "the one column that is not of medians" in table
        for pe, r in res["decode"]["results"]["schemes"].items():
            assert f"| {pe} | {r['speedup']:.1f}x | {r['speedup_fastest']:.1f}x | {r['ratio_cached']:.2f} |" in table
        assert (run / "table.md").read_text().strip() == table.strip()


COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.mark.parametrize("folder", sorted(str(p.parent.relative_to(COMMITTED)) for p in COMMITTED.rglob("table.md")))
def test_every_committed_table_is_the_rendering_of_its_results(folder):
    """The pages link each run's table.md instead of retyping its figures: it must be what its JSON files render."""
    from benchmarks.report import load_results, render_table

    run = COMMITTED / folder
    assert (run / "table.md").read_text().strip() == render_table(load_results(run)).strip()


def test_attention_settings_name_the_switches_that_choose_the_computation(monkeypatch):
    from posenc_lib.attention import cpu_flash

    settings = attention_settings()
    assert settings["cpu_flash.WRITTEN_BACKWARD"] is True and settings["layer.FUSED_BLOCK_ROWS"] == 128
    monkeypatch.setattr(cpu_flash, "BACKWARD_BLOCK_ROWS", None)
    assert attention_settings()["cpu_flash.BACKWARD_BLOCK_ROWS"] is None



def test_side_by_side_runs_the_two_trees_in_alternating_processes(capsys):
    """benchmarks.side_by_side: each round one process per tree, the first tree alternating, ratios to none of the
    same process, and per tree the median over the rounds (here both trees are this one, the tiny model)."""
    import statistics

    from benchmarks import side_by_side

    root = str(Path(__file__).resolve().parents[1])
    res = side_by_side.main(["--before", root, "--after", root, "--schemes", "t5,alibi", "--batch", "1", "--length",
                             "16", "--rounds", "3", "--repeats", "1", "--threads", "1", "--quick"])  # fmt: skip
    assert [list(row) for row in res["rounds"]] == [["before", "after"], ["after", "before"], ["before", "after"]]
    assert all(set(t) == {"t5", "alibi"} and all(r > 0 for r in t.values()) for row in res["rounds"] for t in row.values())
    for tree in ("before", "after"):
        assert res["medians"][tree]["t5"] == statistics.median(row[tree]["t5"] for row in res["rounds"])
    out = capsys.readouterr().out
    assert "round 1, after: t5" in out and "before, median of 3 rounds: t5" in out


@pytest.mark.parametrize("args, message", [
    (["--before", "{tmp}", "--schemes", "t5"], "is not a source tree of this project"),
    (["--before", "{root}", "--schemes", "none"], "at least one scheme besides none"),
    (["--before", "{root}", "--schemes", "t6"], "unknown scheme(s) ['t6']"),
    (["--before", "{root}", "--schemes", "t5", "--rounds", "0"], "--rounds must be a positive integer, got 0"),
])  # fmt: skip
def test_side_by_side_refuses_bad_input_naming_it(args, message, tmp_path, capsys):
    from benchmarks import side_by_side

    root = str(Path(__file__).resolve().parents[1])
    with pytest.raises(SystemExit) as exit_:
        side_by_side.main([a.format(tmp=tmp_path, root=root) for a in args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
