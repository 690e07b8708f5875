#!/usr/bin/env bash
# Lesson 13's decoder-only reversal runs with 16000 updates: every scheme of the decoder-only model, seeds 0..4,
# the schedule stretched over the longer budget (--steps).  With 8000 updates (scripts/extrapolation_budget.sh)
# nine of these fifty runs end short of mastery; this grid gives all of them the longer budget alike.  One seed
# at a time, two models at once on one thread each, so that a stopped run leaves whole seeds behind; finished
# models are skipped: run the script again to resume.  All fifty master.  Measured on seeds 0 and 2-4: 7-14 minutes
# per model on one thread, two at a time; all 50 about 8 CPU hours, 4 hours on 2 cores.
#   bash scripts/extrapolation_budget_16000.sh
#   SEEDS="1 0" bash scripts/extrapolation_budget_16000.sh
# Other work on the same cores while this runs: .venv/bin/python scripts/with_budget_paused.py COMMAND
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SEEDS=${SEEDS:-"0 1 2 3 4"}
DECODER=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide
for seed in $SEEDS; do
  "$PY" -m posenc_lib.experiments.extrapolation --profile budget --task reverse --arch decoder --steps 16000 \
    --pe "$DECODER" --seeds "$seed" --out results/extrapolation_budget_16000/reverse/decoder --jobs 2 --no-progress
done
