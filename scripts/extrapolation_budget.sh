#!/usr/bin/env bash
# Lesson 13's budget runs: every scheme, both architectures, the reversal task (seeds 0..4) and the copy task
# (seeds 0..2), in rounds: reversal seed 0, copy seed 0, reversal seed 1, copy seed 1, ..., so that a stopped run
# leaves whole seeds of both tasks behind.  The two architectures train side by side, one CPU thread each.
# Finished models are skipped: run the script again to resume.
#   bash scripts/extrapolation_budget.sh            # everything: 160 models of 8000 updates, about 6.3 hours on 2 cores
#   SEEDS="0 1 2" TASKS=reverse bash scripts/extrapolation_budget.sh
# Other work on the same cores while this runs: .venv/bin/python scripts/with_budget_paused.py COMMAND (stops the
# training for it and records the pause, which the cost per model in lesson 13 and the README leaves out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SEEDS=${SEEDS:-"0 1 2 3 4"}
COPY_SEEDS=${COPY_SEEDS:-"0 1 2"}
TASKS=${TASKS:-"reverse copy"}
ENCDEC=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,alibi-split
DECODER=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide
chain() {  # arch, schemes
  for seed in $(printf '%s\n' $SEEDS $COPY_SEEDS | sort -n -u); do
    for task in $TASKS; do
      if [ "$task" = copy ]; then seeds=" $COPY_SEEDS "; else seeds=" $SEEDS "; fi
      case "$seeds" in *" $seed "*) ;; *) continue ;; esac
      "$PY" -m posenc_lib.experiments.extrapolation --profile budget --task "$task" --arch "$1" --pe "$2" \
        --seeds "$seed" --out "results/extrapolation_budget/$task/$1" --jobs 1 --no-progress
    done
  done
}
chain decoder "$DECODER" &
dec=$!
chain encdec "$ENCDEC" &
enc=$!
trap 'kill $dec $enc 2>/dev/null' INT TERM
wait $dec; wait $enc
