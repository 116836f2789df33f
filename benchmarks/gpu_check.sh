#!/usr/bin/env bash
# The GPU check: pareto end to end on a CUDA device inside one deadline, with a table of what finished.
#
# Steps, most important first (each under a time limit, its result written under $OUT as it finishes):
#   1. env         the environment: python, torch, CUDA, torchao, device name, compute capability, TF32, driver;
#   2. techniques  `pareto techniques --device $DEVICE --task demo --json`;
#   3. search      the main job: `pareto search --slo-p99 7ms --device $DEVICE` (the demo task, the default
#                  space for the device), its pick confirmed at the end of the search; its --timeout (no new
#                  trial after 40 % of the step's limit: it counts the trials only) leaves the set-up before
#                  them (the task, kernel and pair probes, the baseline), the last trial and the confirmation
#                  their time; a search killed at its limit is interrupted and confirms nothing;
#   4. best        `pareto best --json`: the pick, and whether its metrics come from the confirmation;
#   5. levers      benchmarks/gpu_levers.py: the levers alone and together, per task, in one interleaved run;
#   5b. large     benchmarks/gpu_levers.py --levers large on transformer-large (cuda only; LARGE_TASK= skips it):
#                  bf16, fp8, int4 and 2:4 on a compute-bound model, which is trained here on first use;
#   6. measure     benchmarks/gpu_levers.py --levers techniques: every technique `pareto techniques` lists as
#                  available on $DEVICE (served on eager, finetune aside), alone, timed beside the baseline,
#                  all in one process; a technique that fails keeps its reason and fails the step;
#   7. calibrate   `pareto calibrate --device $DEVICE`: the device's measured peak FLOP/s per dtype and bandwidth;
#      roofline    `pareto roofline --device $DEVICE` (the datasheet profile of the GPU it finds, else the calibration);
#   8. export      `pareto export` of the pick, checked in a fresh Python process;
#   9. tests       the test files with CUDA tests (they skip without a GPU).
#
# Run from a checkout (or a tree with tests/, configs/ and benchmarks/) where `python3 -m pareto` imports pareto:
#   OUT=gpu-check bash benchmarks/gpu_check.sh    # at most 8 minutes (DEADLINE=480), steps not reached skipped
#   DEVICE=cpu bash benchmarks/gpu_check.sh       # the same steps, smaller, on the CPU: about 2 to 4 minutes on 2 cores
# The built-in tasks' trained weights are cached in $PARETO_CACHE_DIR (default ~/.cache/pareto); a machine
# without them trains the demo, transformer and resnet tasks inside the steps that load them first.
#
# The check stops at DEADLINE seconds: each step runs under `timeout` for at most its own limit (60 to 270 s; the
# tests get what is left) or the time left less RESERVE (10 s, for a step's kill, its record and the table), and
# is killed with its whole process group when that passes; a step that would start with under MIN_STEP seconds
# left is skipped. TERM or INT stops the running step the same way. Either way the table of what finished is
# printed and saved as $OUT/table.md (it is also rewritten after every step). Exit status: 0 when every step
# passed, 1 when one failed, timed out or was skipped, 143 when stopped by TERM or INT.
# Files under $OUT: NAME.json per step (name, status pass/FAIL/timeout/skipped/stopped, exit code, seconds,
# limit, the JSON it printed, the end of its standard error), NAME.out and NAME.err, log.txt, plan.txt, table.md,
# gpu.db (the study), levers.rows.json and measure.rows.json (gpu_levers' rows), export/ (the artifact).
#
# Environment: OUT (results folder, default ./gpu-check), PY (python, default python3), CHECK_PY (python for the
# bookkeeping, which imports only the standard library; default $PY), DEVICE (cuda or cpu, default cuda),
# DEADLINE (seconds, default 480), MIN_STEP (default 10), N_TRIALS (the main job's new configurations; default 16
# on cuda, 4 on cpu), LEVERS_TASKS (default demo,transformer,resnet on cuda, demo on cpu), LARGE_TASK (the
# compute-bound task: transformer-large on cuda, none on cpu; empty skips the step), SAMPLES and ROUNDS
# (gpu_levers' timed calls and rounds; default 680 and 20 on cuda, 60 and 4 on cpu; the large step takes half),
# TESTS (pytest files;
# default: the files with CUDA tests on cuda, tests/test_devices.py and tests/test_compress_gpu.py on cpu).
set -u
OUT=${OUT:-gpu-check}
PY=${PY:-python3}
CHECK_PY=${CHECK_PY:-$PY}
DEVICE=${DEVICE:-cuda}
DEADLINE=${DEADLINE:-480}
MIN_STEP=${MIN_STEP:-10}
if [ "$DEVICE" = cpu ]; then
  N_TRIALS=${N_TRIALS:-4}; LEVERS_TASKS=${LEVERS_TASKS:-demo}; SAMPLES=${SAMPLES:-60}; ROUNDS=${ROUNDS:-4}
  LARGE_TASK=${LARGE_TASK-}
  TESTS=${TESTS:-tests/test_devices.py tests/test_compress_gpu.py}
else
  N_TRIALS=${N_TRIALS:-16}; LEVERS_TASKS=${LEVERS_TASKS:-demo,transformer,resnet}
  SAMPLES=${SAMPLES:-680}; ROUNDS=${ROUNDS:-20}
  LARGE_TASK=${LARGE_TASK-transformer-large}
  TESTS=${TESTS:-tests/test_devices.py tests/test_compress_gpu.py tests/test_measure_latency.py tests/test_measure_memory.py tests/test_measure_environment.py tests/test_measure_calibrate.py tests/test_compress_quantize.py tests/test_compress_prune.py}
fi
KILL_AFTER=5  # seconds between a step's TERM and its KILL
RESERVE=$((KILL_AFTER + 5))  # seconds kept after the last step for its KILL, its record and the table
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DB="sqlite:///$OUT/gpu.db"
START=$SECONDS
CURRENT=""       # the step running now
CURRENT_PID=""   # its `timeout` process, the leader of the step's process group
CURRENT_START=0
CURRENT_LIMIT=0
CURRENT_JSON=""
: > "$OUT/log.txt"
PLAN="env techniques search best levers ${LARGE_TASK:+large }measure calibrate roofline export tests"
for name in $PLAN; do rm -f "$OUT/$name.json" "$OUT/$name.out" "$OUT/$name.err"; done  # an earlier check's
rm -f "$OUT/levers.rows.json" "$OUT/large.rows.json" "$OUT/measure.rows.json" "$OUT/table.md"
echo "$PLAN" | tr ' ' '\n' > "$OUT/plan.txt"

record() {  # record NAME STATUS EXIT SECONDS LIMIT [JSON_FILE]: OUT/NAME.json, then the table so far
  $CHECK_PY "$HERE/gpu_check.py" record "$OUT" "$@" >> "$OUT/log.txt" 2>&1
  $CHECK_PY "$HERE/gpu_check.py" table "$OUT" > /dev/null 2>> "$OUT/log.txt"
  if [ "$2" = skipped ]; then
    echo "--- $1: skipped (deadline)" | tee -a "$OUT/log.txt"
  else
    echo "--- $1: $2 (exit $3, $4 s)" | tee -a "$OUT/log.txt"
  fi
}

limit_for() {  # limit_for CAP: the seconds a step starting now may take (under MIN_STEP: it is skipped)
  local left=$((DEADLINE - (SECONDS - START) - RESERVE))
  echo $(($1 < left ? $1 : left))
}

step() {  # step NAME CAP JSON_FILE COMMAND...: run it under the deadline, log it, time it, record it
  local name=$1 cap=$2 json=$3; shift 3
  local limit
  limit=$(limit_for "$cap")
  if [ "$limit" -lt "$MIN_STEP" ]; then
    record "$name" skipped 0 0 0
    return 0
  fi
  echo "=== $name (limit ${limit} s): $*" | tee -a "$OUT/log.txt"
  CURRENT=$name CURRENT_START=$SECONDS CURRENT_LIMIT=$limit CURRENT_JSON=$json
  # timeout makes its own process group and signals all of it: the command's children are killed too
  timeout --kill-after="$KILL_AFTER" "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" &
  CURRENT_PID=$!
  wait "$CURRENT_PID"
  local rc=$?
  CURRENT_PID=""
  local status=pass
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout; elif [ $rc -ne 0 ]; then status=FAIL; fi
  tail -n 25 "$OUT/$name.out" "$OUT/$name.err" >> "$OUT/log.txt" 2>/dev/null
  record "$name" "$status" "$rc" "$((SECONDS - CURRENT_START))" "$limit" ${json:+"$json"}
}

finish() {  # print the table of what finished; its status: 0 when every step passed, else 1
  echo
  $CHECK_PY "$HERE/gpu_check.py" table "$OUT"
  local rc=$?
  echo "(the check took $((SECONDS - START)) s of its ${DEADLINE} s; results in $OUT)"
  return $rc
}

stopped() {  # TERM or INT from outside: stop the running step's process group, record it, print the table
  trap '' TERM INT
  if [ -n "$CURRENT_PID" ]; then
    kill -TERM -- "-$CURRENT_PID" 2>/dev/null || kill -TERM "$CURRENT_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$CURRENT_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$CURRENT_PID" 2>/dev/null
    record "$CURRENT" stopped 143 "$((SECONDS - CURRENT_START))" "$CURRENT_LIMIT" ${CURRENT_JSON:+"$CURRENT_JSON"}
  fi
  finish
  exit 143
}
trap stopped TERM INT

# 1–2. the environment and what can run on it
step env 60 "" $PY "$HERE/gpu_check.py" env --device "$DEVICE"
step techniques 120 "" $PY -m pareto techniques --device "$DEVICE" --task demo --json

# 3–4. the main job, its pick confirmed: no trial starts after 40 % of its limit (the search's --timeout counts
# its trials, not its set-up), so the set-up, the last trial and the confirmation finish inside it
SEARCH_LIMIT=$(limit_for 270)
step search 270 "" $PY -m pareto search --slo-p99 7ms --device "$DEVICE" --n-trials "$N_TRIALS" --db "$DB" --json \
  --timeout "$((SEARCH_LIMIT * 4 / 10 > 1 ? SEARCH_LIMIT * 4 / 10 : 1))s"
step best 60 "" $PY -m pareto best --study demo --slo-p99 7ms --db "$DB" --json

# 5. the levers table
step levers 240 "$OUT/levers.rows.json" $PY "$HERE/gpu_levers.py" --tasks "$LEVERS_TASKS" --device "$DEVICE" \
  --samples "$SAMPLES" --rounds "$ROUNDS" --out "$OUT/levers.rows.json"

# 5b. the compute-bound task (trained on the GPU on first use, inside this step, unless PARETO_CACHE_DIR has it)
if [ -n "$LARGE_TASK" ]; then
  step large 200 "$OUT/large.rows.json" $PY "$HERE/gpu_levers.py" --levers large --tasks "$LARGE_TASK" \
    --device "$DEVICE" --samples "$((SAMPLES / 2))" --rounds "$((ROUNDS / 2 > 2 ? ROUNDS / 2 : 2))" \
    --out "$OUT/large.rows.json"
fi

# 6. every technique that says it is available, timed beside the baseline in one process
step measure 180 "$OUT/measure.rows.json" $PY "$HERE/gpu_levers.py" --levers techniques --tasks demo \
  --device "$DEVICE" --samples "$SAMPLES" --rounds "$ROUNDS" --out "$OUT/measure.rows.json"

# 7–8. the device's ceilings and the roofline, and the pick exported and checked in a fresh process
step calibrate 60 "" $PY -m pareto calibrate --device "$DEVICE" --db "$DB" --json
step roofline 60 "" $PY -m pareto roofline --device "$DEVICE" --db "$DB" --json
step export 120 "" $PY -m pareto export --study demo --best --db "$DB" --output "$OUT/export" --force --json

# 9. the CUDA tests, with what time is left
# shellcheck disable=SC2086
step tests 600 "" $PY -m pytest -q -p no:cacheprovider -rs $TESTS

finish
exit $?
