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
# Before any training it checks SEEDS, the python (PYTHON, default .venv/bin/python), that the machine has the 2 CPU
# cores the two models at once need, and that no other run of this script (or the training it started) goes on.
# It ends with one line: done, the seed that failed, or stopped (SIGINT/SIGTERM stop the training too).
set -euo pipefail
cd "$(dirname "$0")/.."
ME=scripts/extrapolation_budget_16000.sh
PY=${PYTHON:-.venv/bin/python}
SEEDS=${SEEDS-"0 1 2 3 4"}
OUT=results/extrapolation_budget_16000/reverse/decoder
DECODER=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide
fail() { local rc=$1; shift; echo "error: $*" >&2; exit "$rc"; }  # fail STATUS MESSAGE...
[ $# -eq 0 ] || fail 2 "usage: [SEEDS=\"1 0\"] bash $ME (no arguments)"
[[ $SEEDS =~ ^[[:space:]]*[0-9]+([[:space:]]+[0-9]+)*[[:space:]]*$ ]] ||
  fail 2 "SEEDS must be integers separated by spaces, got '$SEEDS'"
command -v -- "$PY" > /dev/null || fail 1 "no python at $PY: make the environment (make env) or set PYTHON"
command -v setsid > /dev/null || fail 1 "$ME needs setsid (util-linux)"
# two models train at once on one thread each: on one core each would also time the other (its cost per model)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
[ "$cores" -ge 2 ] ||
  fail 1 "this run trains two models at once, one thread each, and needs 2 CPU cores; nproc says $cores"
# one run at a time: the lock is held by this shell and the training it starts, so it lasts as long as they do
if command -v flock > /dev/null; then
  exec 9< "$ME"
  flock -n 9 || fail 1 "$ME already runs on this machine (or the training it started does): wait for it," \
    "or stop it and run this again to resume"
fi

py=""
stop() {  # signal name, exit status: Ctrl-C to the training (it stops its workers and releases its folder lock)
  trap '' INT TERM HUP
  if [ -n "$py" ]; then kill -INT "$py" 2>/dev/null; wait "$py" 2>/dev/null || true; fi
  echo "stopped ($1): finished models are kept in $OUT; run $ME again to resume (finished models are skipped)" >&2
  exit "$2"
}
trap 'stop SIGINT 130' INT
trap 'stop SIGTERM 143' TERM
trap 'stop SIGHUP 129' HUP
for seed in $SEEDS; do
  # in the background, a session of its own, Ctrl-C restored: the trap above runs at once and stops it, once
  ( trap - INT; exec setsid "$PY" -m posenc_lib.experiments.extrapolation --profile budget --task reverse \
    --arch decoder --steps 16000 --pe "$DECODER" --seeds "$seed" --out "$OUT" --jobs 2 --no-progress ) &
  py=$!
  rc=0
  wait "$py" || rc=$?
  py=""
  [ "$rc" = 0 ] || fail 1 "seed $seed stopped at a failed model (exit $rc; its message is above); finished models" \
    "are kept in $OUT: run $ME again to resume"
done
echo "done: every model of seeds $SEEDS is in $OUT"
