#!/usr/bin/env bash
# The GPU check: pareto end to end on a CUDA device, with a table at the end.
#
#   1. the CUDA tests (tests that skip without a GPU run here);
#   2. the main job on cuda (the demo task, the default CUDA search space), its pick confirmed;
#   3. `pareto measure` of every technique `pareto techniques --device cuda` lists as available,
#      each beside the baseline: nothing listed may fail;
#   4. `pareto roofline --device cuda`;
#   5. `pareto export` of the pick, checked in a fresh Python process.
#
# Run from a checkout (or a tree with tests/ and configs/) where `python3 -m pareto` imports pareto:
#   OUT=gpu-check bash benchmarks/gpu_check.sh            # about 5 minutes on an H200
# Environment: OUT (results folder, default ./gpu-check), PY (python, default python3),
# N_TRIALS (main job's new configurations, default 16), TESTS (pytest files; default: those with CUDA tests).
set -u
OUT=${OUT:-gpu-check}
PY=${PY:-python3}
N_TRIALS=${N_TRIALS:-16}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu runs the same steps on the CPU (how the script itself is tested)
TESTS=${TESTS:-tests/test_devices.py tests/test_compress_gpu.py tests/test_measure_latency.py tests/test_measure_memory.py tests/test_measure_environment.py tests/test_measure_calibrate.py tests/test_compress_quantize.py tests/test_compress_prune.py}
mkdir -p "$OUT"
DB="sqlite:///$(cd "$OUT" && pwd)/gpu.db"
status() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/summary.tsv"; }
: > "$OUT/summary.tsv"
step() {  # step NAME COMMAND...: run it, log it, time it, record pass/fail
  local name=$1; shift
  local start=$SECONDS
  echo "=== $name: $*" | tee -a "$OUT/log.txt"
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  tail -n 25 "$OUT/$name.out" "$OUT/$name.err" >> "$OUT/log.txt"
  status "$name" "$([ $rc -eq 0 ] && echo pass || echo "FAIL (exit $rc)")" "$((SECONDS - start)) s"
  return $rc
}

$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" | tee -a "$OUT/log.txt"

# 1. the CUDA tests
# shellcheck disable=SC2086
step tests $PY -m pytest -q -p no:cacheprovider -rs $TESTS

# 2. the main job on cuda
step search $PY -m pareto search --slo-p99 7ms --device "$DEVICE" --n-trials "$N_TRIALS" --db "$DB" --json

# 3. every technique that says it is available, measured beside the baseline
step techniques $PY -m pareto techniques --device "$DEVICE" --task demo --json
$PY - "$OUT/techniques.out" > "$OUT/available.txt" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
for row in rows:
    if row["available"] and "eager" in row["backends"] and row["name"] != "finetune":
        params = ",".join(f"{k}={v}" for k, v in row["judged_with"].items())
        print(row["name"] + (f":{params}" if params else ""))
PY
while read -r option; do
  step "measure-${option%%:*}" $PY -m pareto measure --device "$DEVICE" --technique "$option" --samples 340 --rounds 10 \
    --db "$DB" --json
done < "$OUT/available.txt"

# 4. the roofline on the GPU
step roofline $PY -m pareto roofline --device "$DEVICE" --hardware h200 --json

# 5. the pick, exported and checked in a fresh process
step export $PY -m pareto export --study demo --best --db "$DB" --output "$OUT/export" --force --json

# the table
$PY - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n| step | result | time | detail |\n|---|---|---|---|")
for line in (out / "summary.tsv").read_text().splitlines():
    name, result, took = line.split("\t")
    detail = ""
    try:
        data = json.loads((out / f"{name}.out").read_text() or "null")
    except ValueError:
        data = None
    if name == "search" and data:
        tried = data["trials_run"] - data["repeats"] - data["busy_trials"]
        best = data["best"] or {}
        m = best.get("metrics", {})
        confirmed = "confirmed" if best.get("confirmation") else "not confirmed"
        detail = (f"{data['measured']} of {tried} new configurations measured, {data['rejected_early']} rejected early; "
                  f"pick trial {best.get('trial')} {best.get('description', '')}: p99 {m.get('latency_p99_ms', 0):.3f} ms, "
                  f"{m.get('speedup_p99', 0):.2f}x p99, accuracy {m.get('accuracy', 0):.4f} ({confirmed})")
    elif name.startswith("measure-") and data:
        m = data["metrics"]
        detail = f"p99 {m['latency_p99_ms']:.3f} ms, {m['speedup_p99']:.2f}x p99, accuracy {m['accuracy']:.4f}"
    elif name == "export" and data:
        detail = f"{data.get('format')} max abs diff {data.get('max_abs_diff')}"
    elif result != "pass":
        err = (out / f"{name}.err").read_text().strip().splitlines()
        detail = err[-1][:160] if err else ""
    print(f"| {name} | {result} | {took} | {detail} |")
PY
