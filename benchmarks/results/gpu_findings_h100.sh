#!/usr/bin/env bash
# The failures of the GPU law runs (benchmarks/results/gpu_properties_fla_h100_run*.txt), one reproducer each,
# exactly as the run printed it. `benchmarks/gpu.sh replay` runs every line and says which still fail
# (exit status 1: the failure is there) and which hold.
#
# flash-linear-attention 0.6.0 chunk_gla, backward, V < 16 on sm_90 (triton 3.6): CompilationError
# "Input shapes should have M >= 1, N >= 1 and K >= 16" in chunk_gla_bwd_kernel_dA (a [BT, BV] by [BV, BT]
# dot with BV = next_power_of_2(V)); every law of the run met it in the bucket of seed 1354366037 (K = V = 1).
# The run's other 8 failures (gpu_properties_fla_h100_run2.txt) are the same crash under other laws.
REFCHECK_BUCKET_SEED=1354366037 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fla_chunk', Case.make('gla', {'B': 1, 'H': 1, 'K': 1, 'T': 1, 'V': 1}, 'fp32', 0, options={'output_final_state': False, 'scale': None}, draw={'gate_dtype': 'fp32', 'initial_state': False, 'mask_p': 0.0, 'normalizer': 1.0, 'spike_p': 0.0}), mode='tf32', device='cuda')"
REFCHECK_BUCKET_SEED=1354366037 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('varlen_equals_separate', 'fla_chunk', Case.make('gla', {'B': 1, 'H': 1, 'K': 1, 'T': 2, 'V': 1}, 'fp32', 0, seqlens=[1, 1], options={'output_final_state': False, 'scale': None}, draw={'cu_dtype': 'int32', 'gate_dtype': 'fp32', 'initial_state': False, 'mask_p': 0.0, 'normalizer': 1.0, 'spike_p': 0.0}), mode='tf32', device='cuda')"
#
# ours, kda, fp32 q and k, tf32 and tf32x3, a chunk whose decay takes the exact diagonal path (H100,
# Triton 3.6): intra_kernel with two load stages gave A and P wrong by O(1) (o 1.14, dv 1.20, dbeta 1.16 against
# float64); one load stage for fp32 q and k (chunk_fwd.intra) holds (the law runs that found it and, same bucket seed, that
# passed after the fix: benchmarks/results as of dab18c5).
REFCHECK_BUCKET_SEED=3997324711 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'triton', Case.make('kda', {'B': 1, 'H': 2, 'K': 60, 'T': 65, 'V': 60}, 'fp32', 0, options={'lower_bound': None, 'output_final_state': False, 'safe_gate': False, 'scale': 1.0, 'use_gate_in_kernel': True, 'use_qk_l2norm': False}, draw={'dt_bias': True, 'gate_dtype': 'bf16', 'initial_state': True}), mode='tf32', knobs={'disable_recompute': True, 'use_gather': True}, device='cuda')"
# ours, kda_gate, fp32 dA_log over 621 tokens with cancellation (true -3e-4): 1.93e-5 against the 1e-5 guard
# while the naive fp32 form errs 3.9e-5; the guard became 1x the naive error plus 1e-5 (tolerances.toml)
REFCHECK_BUCKET_SEED=3997324711 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('batch_invariance', 'triton', Case.make('kda_gate', {'B': 3, 'H': 1, 'K': 1, 'T': 207}, 'fp32', 692, options={'lower_bound': -0.015625}, draw={'dt_bias': False, 'input_scale': 1.0}), mode='ieee', device='cuda')"
# ours, kda, fp32, log-decay spikes of -1000 (H100): o 1.39e-5, dq 1.72e-5 against guards of 1e-5 with the fp32
# cumulative gate (its law run: benchmarks/results as of dab18c5); the gate is fp64 for fp32 inputs now (chunk.tiles.cumulative_gate_dtype)
REFCHECK_BUCKET_SEED=378734248 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('state_chaining', 'triton', Case.make('kda', {'B': 1, 'H': 1, 'K': 16, 'T': 5, 'V': 16}, 'fp32', 2, options={'lower_bound': None, 'output_final_state': False, 'safe_gate': False, 'scale': None, 'use_gate_in_kernel': False, 'use_qk_l2norm': False}, draw={'gate_dtype': 'fp32', 'initial_state': False, 'mask_p': 0.2, 'normalizer': 1.0, 'spike': 1000.0, 'spike_p': 0.05}), mode='ieee', knobs={'disable_recompute': False, 'use_gather': True}, params={'split': 1}, device='cuda')"
#
# ours, kda, bf16, the diagonal levels of intra_kernel written as a loop (`for lvl in range(4)`) inside the span branch of the
# pipelined channel loop (commit f1156eb; H100, Triton 3.6): o wrong by 0.92 and gradients by 0.8 to 1.7 against
# float64 at every shape of `benchmarks/kda.py`, normal decay included; unrolled (tl.static_range, c5bf824 on) right. No
# reproducer line: the code that shows it is not in the tree; `git checkout f1156eb` and run its GPU script's `bench` step
# (its error columns) shows it.
