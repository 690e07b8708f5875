#!/usr/bin/env bash
# The WMT14 finale on one GPU, unattended: the CUDA tests, a calibration that fits max_steps to a time
# budget, the run itself, and (with BENCH=1) the benchmark suite in bf16. Each stage is logged with its
# time; every model's result is written the moment it finishes, so a cut-off run keeps what finished.
#
#   bash scripts/gpu_finale.sh start [BUDGET_MIN]  # launch in the background (outlives this shell), then follow
#   bash scripts/gpu_finale.sh follow [SECONDS]    # print the log as it grows until done or SECONDS pass (540)
#   bash scripts/gpu_finale.sh pack DEST           # run folder (no checkpoints), log, benchmarks: DEST/wmt14-gpu.tar.gz
#
# One pipeline per run folder: `start` while one runs is refused (RUN_DIR.pid holds its process id; a file
# left by a pipeline that no longer runs is taken over). A second start appends to RUN_DIR.log, so the log
# of an earlier start is kept; `pack` never replaces an existing DEST/wmt14-gpu.tar.gz.
#
# BUDGET_MIN (default 14) is the wall time the run itself may take, after the tests and the calibration.
# The training data: SOURCE=hub (default) streams PAIRS (600000) pairs of the hub's wmt14 fr-en training split
# (needs internet); SOURCE=files uses the 280k pairs shipped in data/ (offline); DATA=FOLDER uses a folder made
# by `python -m posenc_lib.experiments.wmt14 make-data` (offline). Other settings from the environment: PYTHON
# (python3), RUN_DIR (runs/wmt14-gpu), PROFILE (gpu), PES (none,sinusoidal,shaw,rope), SEEDS (0,1), JOBS (auto),
# EXTRA (more calibrate arguments, e.g. "--set micro_batch_tokens=6000"), BENCH (0),
# FOLLOW (seconds `start` follows the log, 540).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${DATA:-}
SOURCE=${SOURCE:-hub}
PAIRS=${PAIRS:-600000}
RUN=${RUN_DIR:-runs/wmt14-gpu}
PROFILE=${PROFILE:-gpu}
PES=${PES:-none,sinusoidal,shaw,rope}
SEEDS=${SEEDS:-0,1}
JOBS=${JOBS:-auto}
EXTRA=${EXTRA:-}
BENCH=${BENCH:-0}
LOG=$RUN.log
DONE=$RUN.done
PIDF=$RUN.pid
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false
# fewer fragments in each model's GPU memory (several models share the card)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
if [ -n "$DATA" ]; then
  DATA_ARGS=(--data-dir "$DATA")
elif [ "$SOURCE" = hub ]; then
  DATA_ARGS=(--source hub --set "max_train_pairs=$PAIRS")
elif [ "$SOURCE" = files ]; then
  DATA_ARGS=(--source files)
else
  echo "SOURCE must be hub or files, got '$SOURCE' (or set DATA=FOLDER)" >&2
  exit 2
fi
# the hub is needed only to read the data; BERTScore and the tests run offline
[ "$SOURCE" = hub ] && [ -z "$DATA" ] || export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

stages() {
  local budget=$1 cmd
  stamp "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  stamp "CUDA tests"
  mkdir -p "$RUN"
  # a failure is recorded and the run goes on: its results say on what they were measured
  if "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py > "$RUN/cuda_tests.txt" 2>&1; then
    tail -n 1 "$RUN/cuda_tests.txt"
  else
    echo "CUDA tests FAILED (see $RUN/cuda_tests.txt); going on"; tail -n 15 "$RUN/cuda_tests.txt"
  fi
  stamp "calibration (budget $budget min)"
  # shellcheck disable=SC2086 # EXTRA is a list of arguments
  "$PY" -m posenc_lib.experiments.wmt14 calibrate --profile "$PROFILE" "${DATA_ARGS[@]}" --pe "$PES" --seeds "$SEEDS" \
    --jobs "$JOBS" --out "$RUN" --budget-min "$budget" $EXTRA
  cmd=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['command'] or '')" "$RUN/calibration.json")
  if [ -z "$cmd" ]; then echo "no max_steps fits the budget"; return 1; fi
  stamp "run: $cmd"
  # shellcheck disable=SC2086 # the command is a list of arguments without spaces inside them
  "$PY" ${cmd#python } --no-progress
  if [ "$BENCH" = 1 ]; then
    stamp "benchmarks (bf16, FlexAttention)"
    POSENC_FLEX=1 "$PY" -m benchmarks.run --device cuda --dtype bfloat16 --lengths 256,1024,4096 \
      --memory-length 4096 --out "$RUN-bench" || echo "benchmarks FAILED"
  fi
  stamp "finished"
}

# take the pipeline lock ($PIDF, created atomically); refuse while the pipeline that holds it runs
lock() {
  local pid
  mkdir -p "$(dirname "$RUN")"
  for _ in 1 2 3; do
    if (set -o noclobber; echo "$$" > "$PIDF") 2>/dev/null; then return 0; fi
    pid=$(cat "$PIDF" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "error: a pipeline already runs for $RUN (pid $pid, log $LOG); follow it with: bash $0 follow" \
        "(or stop it: kill -- -$pid)" >&2
      return 1
    fi
    if [ -z "$pid" ]; then sleep 1; pid=$(cat "$PIDF" 2>/dev/null || true); fi  # being written right now
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    echo "note: $PIDF was left by pid ${pid:-?}, which no longer runs; taking it over" >&2
    rm -f "$PIDF"
  done
  echo "error: could not take $PIDF" >&2
  return 1
}

follow() {
  local limit=${1:-540} shown=${2:-0} n t0=$SECONDS
  while :; do
    if [ -f "$LOG" ]; then
      n=$(wc -l < "$LOG")
      if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$LOG"; shown=$n; fi
    fi
    if [ -f "$DONE" ]; then echo "exit status $(cat "$DONE")"; return 0; fi
    if [ $((SECONDS - t0)) -ge "$limit" ]; then echo "still running after ${limit} s"; return 0; fi
    sleep 5
  done
}

# refuse a value that is not a number before anything starts (a bad BUDGET_MIN failed only in the calibration,
# after the CUDA tests; a bad SECONDS made `follow` print an error every 5 s for ever)
check_number() {  # check_number WHAT VALUE [integer]
  local pattern='^([0-9]+[.]?[0-9]*|[.][0-9]+)$'
  [ "${3:-}" = integer ] && pattern='^[0-9]+$'
  if ! [[ $2 =~ $pattern ]] || { [ "${3:-}" != integer ] && [[ $2 =~ ^[0.]*$ ]]; }; then
    echo "error: $1 must be ${3:+an }${3:-a positive number}, got '$2'" >&2
    exit 2
  fi
}

case "${1:-}" in
  start)
    budget=${2:-14}
    check_number BUDGET_MIN "$budget"
    check_number "FOLLOW (seconds)" "${FOLLOW:-540}" integer
    lock || exit 1
    rm -f "$DONE"  # the status file of the last pipeline, which has ended (the lock says so)
    shown=0
    if [ -s "$LOG" ]; then  # an earlier start's log is kept: this one appends below it
      echo "== $(date -u +%Y-%m-%dT%H:%M:%S) another start (the log above is an earlier one's)" >> "$LOG"
      shown=$(wc -l < "$LOG")
    fi
    # the pipeline takes the lock over (its own pid in $PIDF) and removes it when it ends
    setsid nohup bash -c "echo \$\$ > '$PIDF'; trap 'rm -f \"$PIDF\"' EXIT; set -o pipefail; bash '$0' _stages '$budget'; echo \$? > '$DONE'" >> "$LOG" 2>&1 < /dev/null &
    echo "$!" > "$PIDF"  # the pipeline's pid (it writes the same itself), so the lock outlives this shell
    follow "${FOLLOW:-540}" "$shown"
    ;;
  _stages) stages "${2:?budget}" ;;
  follow) check_number SECONDS "${2:-540}" integer; follow "${2:-540}" ;;
  pack)
    dest=${2:?usage: gpu_finale.sh pack DEST}
    mkdir -p "$dest"
    parts=("$RUN")
    for extra in "$LOG" "$DONE" "$RUN-bench"; do [ -e "$extra" ] && parts+=("$extra"); done
    if [ -e "$dest/wmt14-gpu.tar.gz" ]; then
      echo "error: $dest/wmt14-gpu.tar.gz exists; pack into another DEST or move it away first" >&2
      exit 1
    fi
    tar -czf "$dest/wmt14-gpu.tar.gz.tmp" --exclude='*.pt' --exclude='*.pt.tmp*' --exclude='.posenc-lock' "${parts[@]}"
    mv "$dest/wmt14-gpu.tar.gz.tmp" "$dest/wmt14-gpu.tar.gz"
    ls -l "$dest/wmt14-gpu.tar.gz"
    ;;
  *)
    echo "usage: bash scripts/gpu_finale.sh start [BUDGET_MIN] | follow [SECONDS] | pack DEST" >&2
    exit 2
    ;;
esac
