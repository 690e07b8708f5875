#!/usr/bin/env bash
# Lesson 13's budget runs: every scheme, both architectures, the reversal and copy tasks (seeds 0..4 each), in
# rounds: reversal seed 0, copy seed 0, reversal seed 1, copy seed 1, ..., so that a stopped run leaves whole seeds
# of both tasks behind.  The two architectures train side by side, one CPU thread each.
# Finished models are skipped: run the script again to resume.
#   bash scripts/extrapolation_budget.sh            # everything: 200 models of 8000 updates, about 8 hours on 2 cores
#   SEEDS="0 1 2" TASKS=reverse bash scripts/extrapolation_budget.sh
# Other work on the same cores while this runs: .venv/bin/python scripts/with_budget_paused.py COMMAND (stops the
# training for it and records the pause, which the cost per model in lesson 13 and the README leaves out).
# Before any training it checks the settings, the python (PYTHON, default .venv/bin/python), that the machine has
# the 2 CPU cores the two side-by-side models need, and that no other run of this script (or the training it
# started) goes on.  It ends with one line: done, which chain failed, or stopped (SIGINT/SIGTERM stop the
# training too; finished models are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
ME=scripts/extrapolation_budget.sh
PY=${PYTHON:-.venv/bin/python}
SEEDS=${SEEDS-"0 1 2 3 4"}
COPY_SEEDS=${COPY_SEEDS-"0 1 2 3 4"}
TASKS=${TASKS-"reverse copy"}
OUT=results/extrapolation_budget
ENCDEC=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,alibi-split
DECODER=none,sinusoidal,learned,shaw,rope,t5,xlnet,deberta,alibi,t5-wide
fail() { local rc=$1; shift; echo "error: $*" >&2; exit "$rc"; }  # fail STATUS MESSAGE...
[ $# -eq 0 ] || fail 2 "usage: [SEEDS=\"0 1\"] [COPY_SEEDS=\"0\"] [TASKS=\"reverse copy\"] bash $ME (no arguments)"
ints() {  # ints NAME VALUE [needed]: integers separated by spaces (at least one when needed)
  [[ $2 =~ ^[[:space:]]*([0-9]+([[:space:]]+[0-9]+)*)?[[:space:]]*$ ]] &&
    { [ -z "${3:-}" ] || [ -n "${2// /}" ]; } || fail 2 "$1 must be integers separated by spaces, got '$2'"
}
[ -n "${TASKS// /}" ] || fail 2 "TASKS must be reverse and/or copy, got '$TASKS'"
for task in $TASKS; do
  [ "$task" = reverse ] || [ "$task" = copy ] || fail 2 "TASKS must be reverse and/or copy, got '$TASKS'"
done
ints SEEDS "$SEEDS" $([[ " $TASKS " == *" reverse "* ]] && echo needed)
ints COPY_SEEDS "$COPY_SEEDS" $([[ " $TASKS " == *" copy "* ]] && echo needed)
command -v -- "$PY" > /dev/null || fail 1 "no python at $PY: make the environment (make env) or set PYTHON"
command -v setsid > /dev/null || fail 1 "$ME needs setsid (util-linux)"
# two models train at once on one thread each: on one core each would also time the other (its cost per model)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
[ "$cores" -ge 2 ] ||
  fail 1 "this run trains two models at once, one thread each, and needs 2 CPU cores; nproc says $cores"
# one run at a time: the lock is held by this shell and every training it starts, so it lasts as long as they do
if command -v flock > /dev/null; then
  exec 9< "$ME"
  flock -n 9 || fail 1 "$ME already runs on this machine (or the training it started does): wait for it," \
    "or stop it and run this again to resume"
fi

chain() {  # arch, schemes: the models of one architecture, one after another; stops at the first that fails
  local py=""
  # stopped by the script's trap (TERM; a terminal's Ctrl-C is left to that trap): Ctrl-C to the model in training,
  # once, so that it ends cleanly (its folder lock too)
  trap '' INT
  trap 'if [ -n "$py" ]; then kill -INT "$py" 2>/dev/null; wait "$py"; fi; exit 143' TERM
  for seed in $(printf '%s\n' $SEEDS $COPY_SEEDS | sort -n -u); do
    for task in $TASKS; do
      if [ "$task" = copy ]; then seeds=" $COPY_SEEDS "; else seeds=" $SEEDS "; fi
      case "$seeds" in *" $seed "*) ;; *) continue ;; esac
      # a session of its own, Ctrl-C restored (background commands ignore it): only the trap above stops it, once
      ( trap - INT; exec setsid "$PY" -m posenc_lib.experiments.extrapolation --profile budget --task "$task" \
        --arch "$1" --pe "$2" --seeds "$seed" --out "$OUT/$task/$1" --jobs 1 --no-progress ) &
      py=$!
      wait "$py" || return $?
      py=""
    done
  done
}

stop() {  # signal name, exit status
  trap '' INT TERM HUP
  kill -TERM "$dec" "$enc" 2>/dev/null || true
  wait "$dec" "$enc" 2>/dev/null || true
  echo "stopped ($1): finished models are kept in $OUT; run $ME again to resume (finished models are skipped)" >&2
  exit "$2"
}

chain decoder "$DECODER" &
dec=$!
chain encdec "$ENCDEC" &
enc=$!
trap 'stop SIGINT 130' INT
trap 'stop SIGTERM 143' TERM
trap 'stop SIGHUP 129' HUP
rc_dec=0 rc_enc=0
wait "$dec" || rc_dec=$?
wait "$enc" || rc_enc=$?
failed=""
[ "$rc_dec" = 0 ] || failed="the decoder chain (exit $rc_dec)"
[ "$rc_enc" = 0 ] || failed="${failed:+$failed and }the encdec chain (exit $rc_enc)"
if [ -n "$failed" ]; then
  fail 1 "$failed stopped at a failed model (its message is above); finished models are kept in $OUT:" \
    "run $ME again to resume"
fi
echo "done: every model is in $OUT (TASKS $TASKS, SEEDS $SEEDS, COPY_SEEDS $COPY_SEEDS)"
