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
#
# `start` checks first that PYTHON's torch sees a CUDA GPU and refuses at once without one. REHEARSE_ON_CPU=1
# skips that check to rehearse the pipeline on the CPU (with a small profile: PROFILE=smoke); the tests do so.
# Every subcommand ends with one line saying how it ended: `follow` says whether the pipeline finished (its exit
# status, also the command's), still runs, or no longer runs without having finished (killed), and `pack` refuses
# a pipeline that still runs and writes the archive under a temporary name, renamed once whole.
set -euo pipefail
cd "$(dirname "$0")/.."
SELF=$PWD/scripts/gpu_finale.sh  # the pipeline runs this file again, from this folder
ME="bash scripts/gpu_finale.sh"
USAGE="usage: $ME start [BUDGET_MIN] | follow [SECONDS] | pack DEST"
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

usage() { echo "$USAGE" >&2; exit 2; }

data_args() {  # DATA_ARGS from DATA/SOURCE; a bad SOURCE is refused
  if [ -n "$DATA" ]; then
    DATA_ARGS=(--data-dir "$DATA")
  elif [ "$SOURCE" = hub ]; then
    DATA_ARGS=(--source hub --set "max_train_pairs=$PAIRS")
  elif [ "$SOURCE" = files ]; then
    DATA_ARGS=(--source files)
  else
    echo "error: SOURCE must be hub or files, got '$SOURCE' (or set DATA=FOLDER)" >&2
    exit 2
  fi
  # the hub is needed only to read the data; BERTScore and the tests run offline
  [ "$SOURCE" = hub ] && [ -z "$DATA" ] || export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
}

# a rehearsal on the CPU asks for the CPU by name (the gpu profile is refused on a machine without a GPU otherwise)
if [ "${REHEARSE_ON_CPU:-0}" = 1 ]; then DEVICE_ARGS=(--device cpu); else DEVICE_ARGS=(); fi

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
    --jobs "$JOBS" --out "$RUN" --budget-min "$budget" "${DEVICE_ARGS[@]}" $EXTRA
  cmd=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['command'] or '')" "$RUN/calibration.json")
  if [ -z "$cmd" ]; then echo "no max_steps fits the budget"; return 1; fi
  stamp "run: $cmd"
  # shellcheck disable=SC2086 # the command is a list of arguments without spaces inside them
  "$PY" ${cmd#python } --no-progress "${DEVICE_ARGS[@]}"
  if [ "$BENCH" = 1 ]; then
    stamp "benchmarks (bf16, FlexAttention)"
    POSENC_FLEX=1 "$PY" -m benchmarks.run --device cuda --dtype bfloat16 --lengths 256,1024,4096 \
      --memory-length 4096 --out "$RUN-bench" || echo "benchmarks FAILED"
  fi
  stamp "finished"
}

# the background pipeline (`start` launches it in a session of its own): it holds the lock under its own pid,
# runs the stages, and records its exit status in $DONE and as the last line of the log
pipeline() {
  local budget=$1 rc
  echo "$$" > "$PIDF"
  trap 'rm -f "$PIDF"' EXIT
  trap 'ended 143' TERM; trap 'ended 130' INT; trap 'ended 129' HUP  # `kill -- -PID`: stopped, and says so
  set +e
  bash "$SELF" _stages "$budget"
  rc=$?
  ended "$rc"
}

ended() {
  echo "$1" > "$DONE.tmp" && mv -f "$DONE.tmp" "$DONE"
  stamp "pipeline ended: exit status $1"
  exit "$1"
}

# the pipeline's state from its files: STATE none (never started), running (PID lives), finished ($DONE) or
# gone (it no longer runs and did not finish: killed outright, or stopped before writing $DONE)
pipeline_state() {
  PID=$(cat "$PIDF" 2>/dev/null || true)
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then STATE=running
  elif [ -f "$DONE" ]; then STATE=finished
  elif [ -e "$LOG" ] || [ -e "$PIDF" ] || [ -e "$RUN" ]; then STATE=gone
  else STATE=none; fi
}

# check that PYTHON's torch sees a CUDA GPU (unless REHEARSE_ON_CPU=1), before anything is written
check_gpu() {
  local found
  case "${REHEARSE_ON_CPU:-0}" in
    1) return 0 ;;
    0) ;;
    *) echo "error: REHEARSE_ON_CPU must be 0 or 1, got '${REHEARSE_ON_CPU}'" >&2; exit 2 ;;
  esac
  found=$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null) || found=""
  case "$found" in
    True) ;;
    False)
      echo "error: no CUDA GPU here (torch.cuda.is_available() is False for $PY): the finale needs one;" \
        "to rehearse it on the CPU: REHEARSE_ON_CPU=1 PROFILE=smoke $ME start" >&2
      exit 1 ;;
    *)
      echo "error: $PY cannot import torch; set PYTHON to the python of the environment with torch" \
        "(e.g. PYTHON=.venv/bin/python)" >&2
      exit 1 ;;
  esac
}

# take the pipeline lock ($PIDF, created atomically); refuse while the pipeline that holds it runs
lock() {
  local pid
  mkdir -p "$(dirname "$RUN")"
  for _ in 1 2 3; do
    if (set -o noclobber; echo "$$" > "$PIDF") 2>/dev/null; then return 0; fi
    pid=$(cat "$PIDF" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "error: a pipeline already runs for $RUN (pid $pid, log $LOG); follow it with: $ME follow" \
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

# print the log from line SHOWN+1 as it grows; end with one line on how the pipeline stands (exit status: 0 when
# it finished well or still runs after LIMIT seconds, 1 when it failed or is gone)
follow() {
  local limit=${1:-540} shown=${2:-0} n t0=$SECONDS status gone=0
  pipeline_state
  if [ "$STATE" = none ]; then
    echo "error: no pipeline has started for $RUN (no $LOG); start one with: $ME start [BUDGET_MIN]" >&2
    return 1
  fi
  while :; do
    if [ -f "$LOG" ]; then
      n=$(wc -l < "$LOG")
      if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$LOG"; shown=$n; fi
    fi
    pipeline_state
    case "$STATE" in
      finished)
        status=$(cat "$DONE" 2>/dev/null || true)
        if [ "$status" = 0 ]; then
          echo "the pipeline finished: exit status 0 (log $LOG); pack it with: $ME pack DEST"
          return 0
        elif [ "${status:-0}" -ge 128 ] 2>/dev/null; then
          echo "error: the pipeline was stopped: exit status $status (log $LOG); start it again with: $ME start" >&2
        else
          echo "error: the pipeline failed: exit status ${status:-?} (see the log above, $LOG)" >&2
        fi
        return 1 ;;
      gone)  # seen twice, a second apart: a pid file being written reads empty for a moment
        if [ "$gone" = 1 ]; then
          echo "error: the pipeline for $RUN no longer runs${PID:+ (pid $PID)} and did not finish (no $DONE:" \
            "killed?); its log ends above; pack what it left with: $ME pack DEST, or start again: $ME start" >&2
          return 1
        fi
        gone=1; sleep 1; continue ;;
    esac
    gone=0
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      echo "the pipeline still runs after ${limit} s (pid $PID, log $LOG); follow it again with: $ME follow"
      return 0
    fi
    sleep 1
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

unpack_failed() {  # a pack that did not end well: its partial archive and the folders it made go
  local i
  [ -z "$TMP" ] || rm -f "$TMP"
  for ((i = ${#MADE[@]} - 1; i >= 0; i--)); do rmdir "${MADE[i]}" 2>/dev/null || true; done
}

# pack DEST: the run folder (no checkpoints), log, status and benchmarks into DEST/wmt14-gpu.tar.gz, written under
# a temporary name and renamed once whole; a failure removes the partial archive and the folders it made
pack() {
  local dest=$1 final parts=() d err names status
  final=$dest/wmt14-gpu.tar.gz
  MADE=() TMP=""  # globals: the EXIT trap reads them
  pipeline_state
  case "$STATE" in
    none) echo "error: nothing to pack: no run folder $RUN and no log $LOG; start a run with: $ME start" >&2
          exit 1 ;;
    running) echo "error: the pipeline for $RUN still runs (pid $PID): pack it once it has finished ($ME follow)," \
               "or stop it first (kill -- -$PID) to pack what it has" >&2
             exit 1 ;;
  esac
  if [ -e "$dest" ] && [ ! -d "$dest" ]; then echo "error: DEST $dest is not a folder" >&2; exit 2; fi
  if [ -e "$final" ]; then
    echo "error: $final exists; pack into another DEST or move it away first" >&2
    exit 1
  fi
  for part in "$RUN" "$LOG" "$DONE" "$RUN-bench"; do [ -e "$part" ] && parts+=("$part"); done
  d=$dest
  while [ ! -e "$d" ]; do MADE=("$d" ${MADE[@]+"${MADE[@]}"}); d=$(dirname "$d"); done  # made here, outermost first
  trap unpack_failed EXIT
  trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
  if ! err=$(mkdir -p "$dest" 2>&1) || ! TMP=$(mktemp "$dest/.wmt14-gpu.tar.gz.XXXXXX" 2>&1); then
    echo "error: cannot write into $dest: ${err:-$TMP}" >&2
    TMP=""
    exit 1
  fi
  chmod "$(printf '%o' $((0666 & ~0$(umask))))" "$TMP"  # mktemp makes it private; an archive is read by others
  if ! err=$(tar -czf "$TMP" --exclude='*.pt' --exclude='*.pt.tmp*' --exclude='.posenc-lock' "${parts[@]}" 2>&1); then
    echo "error: packing $RUN failed, nothing written: $(printf '%s\n' "$err" | grep . | tail -n 1)" >&2
    exit 1
  fi
  if ! mv -n "$TMP" "$final" 2>/dev/null || [ -e "$TMP" ]; then  # -n: never over an archive made meanwhile
    echo "error: $final exists; pack into another DEST or move it away first" >&2
    exit 1
  fi
  trap - EXIT INT TERM HUP
  names=""
  for part in "${parts[@]}"; do
    names+="${names:+, }$(basename "$part")"; [ -d "$part" ] && names+="/ (without checkpoints)"
  done
  d="packed $names into $(cd "$dest" && pwd)/wmt14-gpu.tar.gz ($(du -h "$final" | cut -f1))"
  status=$(cat "$DONE" 2>/dev/null || true)
  if [ "$STATE" = gone ]; then
    echo "$d; the pipeline did not finish (no $DONE): this is what it had written"
  elif [ "$status" != 0 ]; then
    echo "$d; the pipeline ended with exit status ${status:-?}: this is what it had written"
  else
    echo "$d"
  fi
}

case "${1:-}" in
  start)
    [ $# -le 2 ] || usage
    budget=${2:-14}
    check_number BUDGET_MIN "$budget"
    check_number "FOLLOW (seconds)" "${FOLLOW:-540}" integer
    data_args
    for tool in setsid nohup; do
      command -v "$tool" > /dev/null || { echo "error: start needs $tool (util-linux, coreutils)" >&2; exit 1; }
    done
    check_gpu
    lock || exit 1
    rm -f "$DONE" "$DONE.tmp"  # the status file of the last pipeline, which has ended (the lock says so)
    shown=0
    if [ -s "$LOG" ]; then  # an earlier start's log is kept: this one appends below it
      echo "== $(date -u +%Y-%m-%dT%H:%M:%S) another start (the log above is an earlier one's)" >> "$LOG"
      shown=$(wc -l < "$LOG")
    fi
    # the pipeline takes the lock over (its own pid in $PIDF) and removes it when it ends
    setsid nohup bash "$SELF" _pipeline "$budget" >> "$LOG" 2>&1 < /dev/null &
    pid=$!
    for _ in $(seq 100); do  # until the pipeline holds the lock, so that it outlives this shell
      [ "$(cat "$PIDF" 2>/dev/null || true)" = "$$" ] && kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    follow "${FOLLOW:-540}" "$shown"
    ;;
  _pipeline) [ $# -eq 2 ] || usage; data_args; pipeline "$2" ;;
  _stages) [ $# -eq 2 ] || usage; data_args; stages "$2" ;;
  follow)
    [ $# -le 2 ] || usage
    check_number SECONDS "${2:-540}" integer
    follow "${2:-540}"
    ;;
  pack)
    [ $# -eq 2 ] && [ -n "$2" ] || usage
    pack "$2"
    ;;
  *) usage ;;
esac
