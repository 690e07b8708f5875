#!/usr/bin/env bash
# The finale's GPU check in one command of at most BUDGET_S seconds (540): the CUDA tests, a profile of one update
# per scheme (posenc_lib/experiments/wmt14/gpucheck.py: time per update, achieved TFLOP/s of the matrix work written
# out per target token, the busiest kernels), then the four schemes at the full recipe (the gpu profile) for one
# seed, each model translated and scored and its result.json written the moment it finishes, into RUN_DIR
# (results/wmt14-gpu-full). The run gets what is left of the budget; when that ends it is stopped with SIGTERM,
# on which the gpu profile writes a checkpoint of every model in training: running the same command again
# continues them (--resume), and finished models are skipped.
#
#   bash scripts/gpu_check.sh                      # on a machine with a CUDA GPU
#   REHEARSE=1 bash scripts/gpu_check.sh           # the same stages on the CPU with the tiny smoke profile
#
# Settings from the environment: PYTHON (python3), RUN_DIR, PROFILE (gpu; smoke when rehearsing), PES
# (none,sinusoidal,shaw,rope), SEEDS (0), JOBS (auto), DATA (a --data-dir folder, e.g. one made by make-data;
# default: the 280k pairs shipped in data/), BUDGET_S (540), TESTS_S (150, the tests' limit), TESTS_K (a pytest -k
# expression picking some CUDA tests), PROFILE_ARGS (more gpucheck arguments, e.g. "--warm 5 --updates 5"),
# EXTRA (more arguments for the profile and the run, e.g. "--set micro_batch_tokens=6000").
# It ends with one line saying how it ended; exit status 0 when every model finished, 3 when the budget ran out
# first (what finished is kept), other values on an error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REHEARSE=${REHEARSE:-0}
case "$REHEARSE" in 0|1) ;; *) echo "error: REHEARSE must be 0 or 1, got '$REHEARSE'" >&2; exit 2 ;; esac
if [ "$REHEARSE" = 1 ]; then
  DEFAULT_PROFILE=smoke DEFAULT_RUN=runs/gpu-check-rehearsal DEVICE_ARGS=(--device cpu)
  export POSENC_TEST_DEVICE=cpu  # the CUDA tests' dry run on the CPU
else
  DEFAULT_PROFILE=gpu DEFAULT_RUN=results/wmt14-gpu-full DEVICE_ARGS=()
fi
PROFILE=${PROFILE:-$DEFAULT_PROFILE}
RUN=${RUN_DIR:-$DEFAULT_RUN}
PES=${PES:-none,sinusoidal,shaw,rope}
SEEDS=${SEEDS:-0}
JOBS=${JOBS:-auto}
BUDGET_S=${BUDGET_S:-540}
TESTS_S=${TESTS_S:-150}
TESTS_K=${TESTS_K:-}
PROFILE_ARGS=${PROFILE_ARGS:-}
EXTRA=${EXTRA:-}
for pair in "BUDGET_S:$BUDGET_S" "TESTS_S:$TESTS_S"; do
  if ! [[ ${pair#*:} =~ ^[0-9]+$ ]] || [ "${pair#*:}" -lt 1 ]; then
    echo "error: ${pair%%:*} must be a positive integer of seconds, got '${pair#*:}'" >&2; exit 2
  fi
done
if [ -n "${DATA:-}" ]; then DATA_ARGS=(--data-dir "$DATA"); else DATA_ARGS=(--source files); fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
T0=$SECONDS
stamp() { echo "== $(date -u +%H:%M:%S) (+$((SECONDS - T0)) s) $*"; }

if [ "$REHEARSE" = 0 ]; then
  found=$("$PY" -c "import torch; print(torch.cuda.is_available())" 2>/dev/null) || found=""
  if [ "$found" != True ]; then
    echo "error: no CUDA GPU for $PY (torch.cuda.is_available() is ${found:-not importable}); to rehearse on the" \
      "CPU: REHEARSE=1 bash scripts/gpu_check.sh" >&2
    exit 1
  fi
fi
mkdir -p "$RUN"
stamp "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

stamp "CUDA tests (limit $TESTS_S s)"
K_ARGS=(); [ -z "$TESTS_K" ] || K_ARGS=(-k "$TESTS_K")
# a failure or the time limit is recorded and the check goes on: the results say on what they were measured
if timeout "$TESTS_S" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py "${K_ARGS[@]}" > "$RUN/cuda_tests.txt" 2>&1
then tail -n 1 "$RUN/cuda_tests.txt"
else echo "CUDA tests FAILED or cut off (see $RUN/cuda_tests.txt); going on"; tail -n 5 "$RUN/cuda_tests.txt"; fi

stamp "profile: one update per scheme"
# shellcheck disable=SC2086 # PROFILE_ARGS and EXTRA are lists of arguments
if ! timeout 180 "$PY" -m posenc_lib.experiments.wmt14.gpucheck --profile "$PROFILE" --pe "$PES" --out "$RUN" \
    "${DATA_ARGS[@]}" "${DEVICE_ARGS[@]}" $PROFILE_ARGS $EXTRA; then
  echo "profile FAILED or cut off; going on to the run"
fi

left=$((BUDGET_S - (SECONDS - T0) - 45))  # 45 s for the checkpoints written on SIGTERM
if [ "$left" -lt 10 ]; then
  stamp "no time left for the run ($((SECONDS - T0)) s of $BUDGET_S used)"
  exit 3
fi
stamp "run: $PES, seed(s) $SEEDS, $PROFILE profile, at most $left s"
set +e
# shellcheck disable=SC2086
timeout --signal=TERM --kill-after=40 "$left" "$PY" -m posenc_lib.experiments.wmt14 --profile "$PROFILE" --pe "$PES" \
  --seeds "$SEEDS" --out "$RUN" --jobs "$JOBS" --resume --no-progress "${DATA_ARGS[@]}" "${DEVICE_ARGS[@]}" $EXTRA
rc=$?
set -e
done_models=$(cd "$RUN" && ls -d ./*-seed*/result.json 2>/dev/null | cut -d/ -f2 | tr '\n' ' ' || true)
if [ "$rc" = 0 ]; then
  stamp "finished: every model scored (${done_models% }); results in $RUN/results.json"
  exit 0
elif [ "$rc" = 124 ] || [ "$rc" = 143 ] || [ "$rc" = 137 ]; then
  stamp "the budget ran out (exit status $rc): finished ${done_models:-none}; the others wrote a checkpoint on" \
    "SIGTERM: run the same command again to continue them"
  exit 3
fi
stamp "the run failed: exit status $rc (see above)"
exit "$rc"
