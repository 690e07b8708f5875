"""The README's cost table quotes benchmarks/results/*.json: check every number it shows."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README_NAMES = {"Shaw, naive (L, L, d) tables": "shaw_naive"}


def _rows():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## What each scheme costs", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.match(r"[\d.]+ / [\d.]+ / [\d.]+", cells[3]):
            yield README_NAMES.get(cells[0], cells[0]), cells


def test_readme_cost_table_matches_benchmark_results():
    train = json.loads((RESULTS / "train.json").read_text())["results"]["lengths"]
    memory = json.loads((RESULTS / "memory.json").read_text())["results"]["schemes"]
    decode = json.loads((RESULTS / "decode.json").read_text())["results"]["schemes"]
    rows = dict(_rows())
    assert set(rows) == set(memory), f"README rows {sorted(rows)} vs results {sorted(memory)}"
    for pe, cells in rows.items():
        ratios = [float(x) for x in re.findall(r"[\d.]+", cells[3])[:3]]
        assert ratios == [round(train[L][pe]["ratio"], 2) for L in ("64", "256", "1024")], pe
        assert float(cells[4].split()[0]) == round(memory[pe]["ratio_peak"], 2), pe
        assert float(cells[5].rstrip("×")) == round(decode[pe]["speedup"], 1), pe
        assert decode[pe]["identical"], pe


WMT14 = ROOT / "results" / "wmt14-cpu" / "results.json"
# README column -> (test set, metric, decimals) as summarised by posenc_lib.wmt14.summarize
WMT14_COLUMNS = [("heldout", "bleu", 1), ("heldout", "shuffled", 1), ("heldout", "chrf", 1),
                 ("heldout", "bertscore_f1", 3), ("newstest2014", "bleu", 1), ("newstest2014", "chrf", 1)]


def test_readme_wmt14_table_matches_results():
    from posenc_lib.wmt14 import summarize

    results = json.loads(WMT14.read_text())
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Lesson 12 results", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 1 + len(WMT14_COLUMNS) and cells[0].strip("`") in results["models"]:
            rows[cells[0].strip("`")] = cells[1:]
    assert set(rows) == set(results["models"]), f"README rows {sorted(rows)} vs results {sorted(results['models'])}"
    for pe, cells in rows.items():
        for cell, (test, metric, nd) in zip(cells, WMT14_COLUMNS):
            mean, std, n = summarize(results, test, metric)[pe]
            shown = [float(x) for x in re.findall(r"[\d.]+", cell)]
            assert shown[0] == round(mean, nd), (pe, test, metric, cell, mean)
            if n > 1:
                assert shown[1] == round(std, nd), (pe, test, metric, cell, std)
