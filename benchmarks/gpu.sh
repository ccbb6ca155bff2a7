#!/usr/bin/env bash
# Everything refcheck runs on a lent GPU machine (see docs/gpu.md). Steps, in the order given:
#   properties  the property laws (Hypothesis profile `gpu`: compile buckets warmed up in parallel first) over
#               IMPLS on OPS (default: our Triton kernels and FLA on kda, kda_gate, gla, simple_gla), judged by
#               the contract bounds (ours by their guards); `pytest -n auto`
#   report      refcheck report --device cuda (REPORT_ARGS: more options, REPORT_TAG: a suffix of its files)
#   fuzz        refcheck fuzz FUZZ_OP --impl FUZZ_IMPL --device cuda --seconds FUZZ_SECONDS (default kda, fla_chunk, 300)
#   fla-reports benchmarks/fla_open_reports.py: FLA's open reports #671 and #1240 through the laws, ours beside
#   fp16-range  benchmarks/fp16_state_range.py: an fp16 input whose state outgrows fp16 (ours and FLA's gla, simple_gla)
#   bench       benchmarks/kda.py: ours vs flash-linear-attention 0.6.0, roofline measured in the run
#   profile     benchmarks/kda.py --profile: each kernel stage under several launch configurations
#   kernels     benchmarks/kda.py --kernels: the CUDA time of each kernel of KERNELS_SHAPES (default B1_T32768),
#               forward and forward+backward, ours and FLA's (KERNELS_ARGS=--ours-only: ours alone), the host's
#               and the wall time of each step, and the host's calls of ours
#   ncu         benchmarks/kda.py --ncu-step under Nsight Compute: what bounds each kernel, ours and FLA's
#   check       benchmarks/kda.py --check: errors vs float64 over option combinations
#   attention-bench  benchmarks/attention.py (ATTENTION_ARGS, e.g. --quick): ours vs flash-attn-4 and SDPA
#   gdn-bench   benchmarks/gdn.py (GDN_ARGS, e.g. --quick): our GDN decode vs FLA's and FlashInfer's, GB/s of the copy rate
#   gdn-prefill benchmarks/gdn_prefill.py (GDN_PREFILL_ARGS, e.g. --quick, --shapes tp8, --kernels, --segment-chunks 0 64):
#               our chunked GDN vs FLA's and FlashInfer's prefill
#   gdn-sweep   benchmarks/gdn.py --sweep: our GDN decode kernel under every launch setting
#   paged-bench benchmarks/paged_attention.py (PAGED_ARGS, e.g. --quick): our paged decode vs FlashInfer's, GB/s of the copy rate
#   attention-sweep  benchmarks/attention_sweep.py (SWEEP_ARGS, e.g. --parts fwd): every launch setting of our kernels
#   gla-bench   benchmarks/gla.py (GLA_ARGS, e.g. --quick or --kernels-only): ours vs FLA chunk_gla / chunk_simple_gla
#   gla-profile benchmarks/gla.py --profile: each GLA kernel stage under several launches (and the bf16x2 update dots)
#   multi-gpu   issue 18 on a host of several GPUs: the same law run (fixed seeds) on GPU 0, then on every GPU,
#               nvidia-smi sampling each GPU; then refcheck fuzz --gpus all over a planted illegal-address kernel and ours
#               (MULTI_PARTS: "laws fuzz", or either; MULTI_SEED, MULTI_FUZZ_SECONDS, MULTI_FUZZ_IMPLS)
#   crash-isolation  a kernel that crashes its process at odd T beside a correct one: pytest and report go on
#   replay      every reproducer line of REPLAY (default benchmarks/results/gpu_findings_h100.sh), each
#               saying whether its failure is still there
#   calibration benchmarks/interpreter_calibration.py on the GPU (every dot, cast and math probe, and kda), compared
#               with the record on disk for this machine's GPU (benchmarks/interpreter_calibration_<h100|h200>.json)
# e.g. `bash benchmarks/gpu.sh properties bench`. Carry [".whl", ".gpu-wheels/a"]; results land
# in $OUT. Each step's time limit is <STEP>_S seconds; IMPLS (default "triton fla") and OPS (default
# "kda kda_gate gla simple_gla") pick the law runs' implementations and ops and PROPERTIES_K (a pytest -k expression) a subset of the law tests, e.g.
# PROPERTIES_K="agreement or precision or batch_invariance" for the slowest ones, alone in one call;
# PROFILE_STAGES (e.g. "recurrence dstate"), PROFILE_SHAPES (e.g. "B1_T32768") and PROFILE_ARGS (e.g. --defaults) limit the profile, BENCH_SHAPES the
# benchmark. Each step starts from a cold
# Triton cache of its own (COLD=0: one shared cache) and its wall time lands in $OUT/timings.txt.
# Prints a short table last.
set -uo pipefail
OUT=${OUT:-/tmp/refcheck-gpu}; mkdir -p "$OUT"
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# the peers' wheels: .gpu-wheels/a (flash-linear-attention), then .gpu-wheels/b (flash-attn-4) in the next call, then
# .gpu-wheels/c and d (FlashInfer, benchmarks/fetch-flashinfer-wheels.sh) in the two after
for part in a b c d; do [ -f ".gpu-wheels/$part/device-install.sh" ] && source ".gpu-wheels/$part/device-install.sh"; done
export PYTHONPATH=/tmp/peers:/tmp/peers/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
export PYTHONUNBUFFERED=1
# autotuning results on disk: every xdist worker and every later run reuses what one measured
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
JOBS=$(nproc)

keep_failures() {   # the failure files of a law run, tarred: their names (test ids: '[', ']') do not travel
  [ -d "$1" ] && tar czf "$2" -C "$(dirname "$1")" "$(basename "$1")"
}

replay_crashes() {  # rerun the reproducer of each example that lost its worker's CUDA context (at most 2) alone,
                    # kernels launched synchronously (the traceback names the kernel), and under compute-sanitizer
                    # where the image has it
  for f in $(ls "$1"/cuda-context-lost-*.txt 2>/dev/null | head -2); do
    line=$(grep -m1 '^  reproduce: ' "$f" | sed 's/^  reproduce: //; s/\bpython -c/python3 -c/')
    echo "== $f: $line" >> "$2"
    CUDA_LAUNCH_BLOCKING=1 timeout 90 bash -c "$line" 2>&1 | tail -25 >> "$2"
    command -v compute-sanitizer >/dev/null && timeout 150 bash -c "${line/python3 -c/compute-sanitizer --print-limit 3 python3 -c}" \
      2>&1 | grep -E "Invalid|at 0x|by thread|Address|ERROR SUMMARY" | head -20 >> "$2"
  done
}

law_run() {         # FAILURE_DIR LOG SECONDS: the property laws (gpu profile) over IMPLS on OPS, pytest -n auto
  REFCHECK_FAILURE_DIR=$1 timeout -k 20 -s INT "$3" \
    python3 -m pytest refcheck/properties -p refcheck.commands.pytest_plugin -n auto -p no:cacheprovider \
    ${PROPERTIES_K:+-k "$PROPERTIES_K"} --device cuda --hypothesis-profile gpu ${PROPERTIES_ARGS:-} \
    $(printf -- "--op %s " ${OPS:-kda kda_gate gla simple_gla}) $(printf -- "--impl %s " ${IMPLS:-triton fla}) \
    -o addopts="" -rfEs -v --durations=0 --hypothesis-show-statistics > "$2" 2>&1
}

for step in "$@"; do
  [ "${COLD:-1}" = 1 ] && export TRITON_CACHE_DIR=/tmp/triton-cache-$step && rm -rf "$TRITON_CACHE_DIR"
  began=$(date +%s)
  case $step in
    properties)
      FAILED=/tmp/failures-properties; rm -rf $FAILED
      law_run "$FAILED" "$OUT/gpu_properties.log" "${PROPERTIES_S:-500}"
      echo "properties exit $?" >> "$OUT/gpu_properties.log"
      replay_crashes $FAILED "$OUT/crashes.log"; keep_failures $FAILED "$OUT/failures.tgz" ;;
    multi-gpu)
      # issue 18: the same law run (compile buckets and Hypothesis examples from fixed seeds, each run
      # with a cold Triton cache and an empty example database of its own) on GPU 0 alone, then on every
      # GPU of the host, -n auto (8 workers a GPU); then one fuzz campaign over every GPU (--gpus all),
      # a planted illegal-address kernel (tests.mutants:gate_crashes_on_odd_lengths) and then ours.
      # nvidia-smi samples each GPU every 500 ms throughout; benchmarks/gpu_busy.py sums it up per phase.
      phase() { echo "$1 $(date '+%Y/%m/%d %H:%M:%S.%N') $2" >> "$OUT/multi_gpu_phases.txt"; }
      nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
        > "$OUT/multi_gpu_smi.csv" 2>&1 & smi=$!
      all=$(python3 -c "import torch; print(','.join(map(str, range(torch.cuda.device_count()))))")
      seeds="--bucket-seed ${MULTI_SEED:-18} --hypothesis-seed ${MULTI_SEED:-18}"
      for gpus in $( [[ " ${MULTI_PARTS:-laws fuzz} " == *" laws "* ]] && echo 0 "$all"); do
        name="laws-on-gpus-${gpus//,/+}"
        export TRITON_CACHE_DIR=/tmp/triton-cache-$name REFCHECK_EXAMPLE_DB=/tmp/examples-$name
        rm -rf "$TRITON_CACHE_DIR" "$REFCHECK_EXAMPLE_DB" /tmp/failures-$name
        phase START "$name"
        CUDA_VISIBLE_DEVICES=$gpus PROPERTIES_ARGS="$seeds ${PROPERTIES_ARGS:-}" \
          law_run /tmp/failures-$name "$OUT/multi_gpu_$name.log" "${PROPERTIES_S:-500}"
        echo "exit $?" >> "$OUT/multi_gpu_$name.log"
        phase END "$name"
      done
      unset REFCHECK_EXAMPLE_DB; export TRITON_CACHE_DIR=/tmp/triton-cache-multi-gpu-fuzz
      rm -rf /tmp/fuzz-multi-gpu; mkdir -p /tmp/fuzz-multi-gpu
      for impl in $( [[ " ${MULTI_PARTS:-laws fuzz} " == *" fuzz "* ]] && echo "${MULTI_FUZZ_IMPLS:-tests.mutants:gate_crashes_on_odd_lengths triton}"); do
        phase START "fuzz-kda_gate-$impl"
        timeout -k 20 -s INT "${FUZZ_LIMIT_S:-240}" python3 -m refcheck fuzz kda_gate --impl "$impl" --device cuda \
          --gpus all --seconds "${MULTI_FUZZ_SECONDS:-30}" --seed "${MULTI_SEED:-18}" --out-dir /tmp/fuzz-multi-gpu \
          >> "$OUT/multi_gpu_fuzz.log" 2>&1
        echo "fuzz $impl exit $?" >> "$OUT/multi_gpu_fuzz.log"
        phase END "fuzz-kda_gate-$impl"
      done
      ls /tmp/fuzz-multi-gpu >> "$OUT/multi_gpu_fuzz.log" 2>&1; keep_failures /tmp/fuzz-multi-gpu "$OUT/multi_gpu_fuzz_found.tgz"
      kill $smi
      python3 benchmarks/gpu_busy.py "$OUT/multi_gpu_smi.csv" "$OUT/multi_gpu_phases.txt" \
        --json "$OUT/multi_gpu_busy.json" > "$OUT/multi_gpu_busy.txt" 2>&1 ;;
    crash-isolation)
      # a kernel that makes an illegal memory access at odd T beside a correct one, both Triton kda_gate
      # kernels (tests/mutant_kernels.py): each law test of the first fails with its example written down
      # and its worker replaced, the second's pass; then the same through `refcheck report`
      FAILED=/tmp/failures-crash; rm -rf $FAILED
      pair="--op kda_gate --impl tests.mutants:gate_crashes_on_odd_lengths --impl tests.mutants:gate_autotuned"
      REFCHECK_FAILURE_DIR=$FAILED timeout -k 20 -s INT "${CRASH_S:-240}" python3 -m pytest refcheck/properties \
        -p refcheck.commands.pytest_plugin -n 8 -p no:cacheprovider --device cuda --hypothesis-profile gpu $pair \
        -o addopts="" -rfE > "$OUT/crash_isolation.log" 2>&1
      echo "pytest exit $?" >> "$OUT/crash_isolation.log"
      timeout -k 20 -s INT "${CRASH_S:-240}" python3 -m refcheck report --device cuda $pair >> "$OUT/crash_isolation.log" 2>&1
      echo "report exit $?" >> "$OUT/crash_isolation.log"
      keep_failures $FAILED "$OUT/crash_failures.tgz" ;;
    report)
      timeout -k 20 -s INT "${REPORT_S:-300}" python3 -m refcheck report --device cuda --jobs "${REPORT_JOBS:-$JOBS}" ${REPORT_ARGS:-} \
        --json "$OUT/gpu_report${REPORT_TAG:-}.json" \
        > "$OUT/gpu_report${REPORT_TAG:-}.log" 2>&1
      echo "report exit $?" >> "$OUT/gpu_report${REPORT_TAG:-}.log" ;;
    fla-reports)
      timeout -k 20 -s INT "${FLA_REPORTS_S:-300}" python3 benchmarks/fla_open_reports.py --out "$OUT/fla_open_reports.json" \
        > "$OUT/fla_open_reports.log" 2>&1
      echo "fla-reports exit $?" >> "$OUT/fla_open_reports.log" ;;
    fp16-range)
      timeout -k 20 -s INT "${FP16_RANGE_S:-300}" python3 benchmarks/fp16_state_range.py --device cuda \
        --out "$OUT/fp16_state_range.json" > "$OUT/fp16_state_range.log" 2>&1
      echo "fp16-range exit $?" >> "$OUT/fp16_state_range.log" ;;
    fuzz)
      timeout -k 20 -s INT "${FUZZ_LIMIT_S:-420}" python3 -m refcheck fuzz "${FUZZ_OP:-kda}" --impl "${FUZZ_IMPL:-fla_chunk}" \
        --device cuda --seconds "${FUZZ_SECONDS:-300}" --out-dir "$OUT" > "$OUT/gpu_fuzz.log" 2>&1
      echo "fuzz exit $?" >> "$OUT/gpu_fuzz.log" ;;
    bench)
      # on a fresh machine the warm-up alone compiled for 388 s (H200, at e286dd1: FLA's autotuned kernels,
      # nine configurations) and the timing takes about 35 s more; with warm caches the whole step took 55 s
      timeout -s INT "${BENCH_S:-570}" python3 benchmarks/kda.py --jobs "$JOBS" ${BENCH_SHAPES:+--shapes $BENCH_SHAPES} --out "$OUT/kda_h200.json" \
        > "$OUT/kda_bench.log" 2>&1
      echo "benchmark exit $?" >> "$OUT/kda_bench.log" ;;
    profile)
      timeout -s INT "${PROFILE_S:-300}" python3 benchmarks/kda.py --profile --jobs "$JOBS" ${PROFILE_STAGES:+--stages $PROFILE_STAGES} ${PROFILE_SHAPES:+--shapes $PROFILE_SHAPES} ${PROFILE_ARGS:-} \
        > "$OUT/kda_profile.log" 2>&1
      echo "profile exit $?" >> "$OUT/kda_profile.log" ;;
    kernels)
      timeout -s INT "${KERNELS_S:-300}" python3 benchmarks/kda.py --kernels ${KERNELS_ARGS:-} --jobs "$JOBS" --shapes ${KERNELS_SHAPES:-B1_T32768} \
        --out "$OUT/kda_kernels.json" > "$OUT/kda_kernels.log" 2>&1
      echo "kernels exit $?" >> "$OUT/kda_kernels.log" ;;
    ncu)
      # hardware counters of every kernel of one B=8 forward+backward, ours and FLA's (each kernel replayed
      # once per counter pass; the clocks left alone, METHOD.md)
      timeout -s INT "${NCU_S:-300}" ncu --profile-from-start off --clock-control none --csv --page raw --print-units base \
        --metrics "$(python3 benchmarks/kda.py --ncu-metrics)" python3 benchmarks/kda.py --ncu-step \
        > "$OUT/kda_ncu.csv" 2> "$OUT/kda_ncu.err"
      echo "ncu exit $?" >> "$OUT/kda_ncu.err"
      python3 benchmarks/kda.py --ncu-table "$OUT/kda_ncu.csv" --out "$OUT/kda_ncu.json" > "$OUT/kda_ncu.txt" 2>&1 ;;
    check)
      timeout -s INT "${CHECK_S:-200}" python3 benchmarks/kda.py --check --jobs "$JOBS" > "$OUT/kda_check.log" 2>&1
      echo "check exit $?" >> "$OUT/kda_check.log" ;;
    attention-bench)
      timeout -s INT "${ATTENTION_BENCH_S:-300}" python3 benchmarks/attention.py ${ATTENTION_ARGS:-} --out "$OUT/attention_bench.json" \
        > "$OUT/attention_bench.log" 2>&1
      echo "attention-bench exit $?" >> "$OUT/attention_bench.log" ;;
    gdn-bench)
      timeout -s INT "${GDN_BENCH_S:-300}" python3 benchmarks/gdn.py ${GDN_ARGS:-} --out "$OUT/gdn_decode.json" \
        > "$OUT/gdn_decode.log" 2>&1
      echo "gdn-bench exit $?" >> "$OUT/gdn_decode.log" ;;
    gdn-prefill)
      timeout -s INT "${GDN_PREFILL_S:-400}" python3 benchmarks/gdn_prefill.py ${GDN_PREFILL_ARGS:-} \
        --out "$OUT/gdn_prefill.json" > "$OUT/gdn_prefill.log" 2>&1
      echo "gdn-prefill exit $?" >> "$OUT/gdn_prefill.log" ;;
    gdn-sweep)
      timeout -s INT "${GDN_SWEEP_S:-200}" python3 benchmarks/gdn.py --sweep --out "$OUT/gdn_decode_sweep.json" \
        > "$OUT/gdn_decode_sweep.log" 2>&1
      echo "gdn-sweep exit $?" >> "$OUT/gdn_decode_sweep.log" ;;
    paged-bench)
      timeout -s INT "${PAGED_BENCH_S:-300}" python3 benchmarks/paged_attention.py ${PAGED_ARGS:-} --out "$OUT/paged_attention_bench.json" \
        > "$OUT/paged_attention_bench.log" 2>&1
      echo "paged-bench exit $?" >> "$OUT/paged_attention_bench.log" ;;
    gla-profile)
      timeout -s INT "${GLA_PROFILE_S:-300}" python3 benchmarks/gla.py --profile --jobs "$JOBS" --out "$OUT/gla_profile.json" \
        > "$OUT/gla_profile.log" 2>&1
      echo "gla-profile exit $?" >> "$OUT/gla_profile.log" ;;
    attention-sweep)
      timeout -s INT "${ATTENTION_SWEEP_S:-300}" python3 benchmarks/attention_sweep.py ${SWEEP_ARGS:-} \
        --out "$OUT/attention_sweep.json" > "$OUT/attention_sweep.log" 2>&1
      echo "attention-sweep exit $?" >> "$OUT/attention_sweep.log" ;;
    gla-bench)
      timeout -s INT "${GLA_BENCH_S:-300}" python3 benchmarks/gla.py --jobs "$JOBS" ${GLA_ARGS:-} --out "$OUT/gla_bench.json" > "$OUT/gla_bench.log" 2>&1
      echo "gla-bench exit $?" >> "$OUT/gla_bench.log" ;;
    replay)
      python() { python3 "$@"; }; export -f python      # the reproducers say `python`
      n=0; grep -v '^#' "${REPLAY:-benchmarks/results/gpu_findings_h100.sh}" | grep . | while IFS= read -r line; do
        n=$((n + 1)); timeout -s INT "${REPLAY_EACH_S:-120}" bash -c "$line" > "$OUT/replay_$n.log" 2>&1
        rc=$?; verdict=$([ $rc = 1 ] && echo "fails (reproduced)" || { [ $rc = 0 ] && echo "holds" || echo "exit $rc"; })
        echo "$verdict (replay_$n.log): ${line:0:200}"; grep -E "violated|raised" "$OUT/replay_$n.log" | head -2
      done > "$OUT/replay.log" 2>&1 ;;
    calibration)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE "h100|h200" | tr 'A-Z' 'a-z')
      timeout -s INT "${CALIBRATION_S:-200}" python3 benchmarks/interpreter_calibration.py --out "$OUT/interpreter_calibration.json" \
        > "$OUT/calibration.log" 2>&1
      python3 benchmarks/interpreter_calibration.py --compare "benchmarks/interpreter_calibration_${gpu:-h100}.json" \
        "$OUT/interpreter_calibration.json" >> "$OUT/calibration.log" 2>&1
      echo "calibration exit $?" >> "$OUT/calibration.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  printf "%-10s %6d s  (Triton cache %s)\n" "$step" "$(( $(date +%s) - began ))" "${TRITON_CACHE_DIR:-default}" \
    | tee -a "$OUT/timings.txt"
done

for step in "$@"; do
  case $step in
    properties) echo "== properties (gpu profile) =="; grep -E "^(FAILED|ERROR)|passed|failed|crashed|properties exit" \
                  "$OUT/gpu_properties.log" | tail -12; ls /tmp/failures-properties 2>/dev/null | head
                [ -f "$OUT/crashes.log" ] && grep -E "^==|Error|error|Invalid|SUMMARY" "$OUT/crashes.log" | head -20 ;;
    multi-gpu) echo "== several GPUs =="
               for f in "$OUT"/multi_gpu_laws-*.log; do echo "-- $(basename "$f")"
                 grep -E "warmed up|passed|failed|^exit" "$f" | cut -c1-200 | tail -4; done
               echo "-- fuzz"; grep -E "^fuzzing|^[0-9]+ of [0-9]+ laws|no counterexample|incomplete|exit|^time:" \
                 "$OUT/multi_gpu_fuzz.log" | cut -c1-200 | tail -12
               echo "crash files written: $(grep -c '^cuda-context-lost' "$OUT/multi_gpu_fuzz.log")"
               cat "$OUT/multi_gpu_busy.txt" ;;
    crash-isolation) echo "== crash isolation =="; grep -E "crashed|replacing|passed|failed|PASS|FAIL|exit" \
                       "$OUT/crash_isolation.log" | cut -c1-200 | tail -24 ;;
    report) echo "== report${REPORT_TAG:-} =="; grep -E "PASS|FAIL|report exit|not run|wall seconds" "$OUT/gpu_report${REPORT_TAG:-}.log" | tail -20 ;;
    fuzz) echo "== fuzz =="; grep -E "compile buckets|^time:|falsified|no counterexample|fuzz exit" "$OUT/gpu_fuzz.log" | tail -8 ;;
    fla-reports) echo "== FLA open reports =="; tail -30 "$OUT/fla_open_reports.log" ;;
    fp16-range) echo "== fp16 state range =="; grep -v Warn "$OUT/fp16_state_range.log" | tail -8 ;;
    bench) echo "== kda benchmark =="; tail -40 "$OUT/kda_bench.log" ;;
    profile) echo "== kda profile =="; grep -E " ms$|failed|exit" "$OUT/kda_profile.log" | tail -40 ;;
    kernels) echo "== kda kernels =="; grep -E "^==|^kernels|^host|exit|Self CPU total|  (cuda|aten::|Kda|[a-z_]+_kernel) " "$OUT/kda_kernels.log" | cut -c1-240 ;;
    ncu) echo "== kda ncu =="; cat "$OUT/kda_ncu.txt"; tail -3 "$OUT/kda_ncu.err" ;;
    check) echo "== kda check =="; tail -12 "$OUT/kda_check.log" ;;
    attention-bench) echo "== attention benchmark =="; tail -30 "$OUT/attention_bench.log" ;;
    attention-sweep) echo "== attention launch settings =="; grep -E "^==|^  |compiled|exit" "$OUT/attention_sweep.log" \
                       | awk '/^==/{n=0} {if (n++ < 3) print}' ;;
    gla-bench) echo "== gla benchmark =="; tail -30 "$OUT/gla_bench.log" ;;
    gdn-bench) echo "== gdn decode benchmark =="; tail -8 "$OUT/gdn_decode.log" ;;
    gdn-prefill) echo "== gdn prefill benchmark =="; tail -7 "$OUT/gdn_prefill.log" ;;
    gdn-sweep) echo "== gdn decode launches =="; tail -3 "$OUT/gdn_decode_sweep.log" ;;
    paged-bench) echo "== paged decode benchmark =="; tail -16 "$OUT/paged_attention_bench.log" ;;
    gla-profile) echo "== gla kernel stages =="; grep -E " ms$|compiled|exit" "$OUT/gla_profile.log" ;;
    replay) echo "== replayed findings =="; grep -E "^(fails|holds|exit)" "$OUT/replay.log" | cut -c1-160 ;;
    calibration) echo "== interpreter calibration (the record on disk vs this GPU) =="; grep -E "flagged|exit" "$OUT/calibration.log" ;;
  esac
done
echo "== wall time per step =="; cat "$OUT/timings.txt"
