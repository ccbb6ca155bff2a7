export COLD=0 BENCH_S=480
bash benchmarks/gpu_session.sh bench > $OUT/session.log 2>&1
grep -E "^shape|^B8|^B1|^varlen|^gradient" $OUT/kda_bench.log | tail -34
