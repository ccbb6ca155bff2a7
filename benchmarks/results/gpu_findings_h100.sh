#!/usr/bin/env bash
# The failures of the GPU law runs (benchmarks/results/gpu_properties_fla_h100_run*.txt), one reproducer each,
# exactly as the run printed it. `benchmarks/gpu_session.sh replay` runs every line and says which still fail
# (exit status 1: the failure is there) and which hold.
#
# flash-linear-attention 0.6.0 chunk_gla, backward, V < 16 on sm_90 (triton 3.6): CompilationError
# "Input shapes should have M >= 1, N >= 1 and K >= 16" in chunk_gla_bwd_kernel_dA (a [BT, BV] by [BV, BT]
# dot with BV = next_power_of_2(V)); every law of the run met it in the bucket of seed 1354366037 (K = V = 1).
# The run's other 8 failures (gpu_properties_fla_h100_run2.txt) are the same crash under other laws.
REFCHECK_BUCKET_SEED=1354366037 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fla_chunk', Case.make('gla', {'B': 1, 'H': 1, 'K': 1, 'T': 1, 'V': 1}, 'fp32', 0, options={'output_final_state': False, 'scale': None}, draw={'gate_dtype': 'fp32', 'initial_state': False, 'mask_p': 0.0, 'normalizer': 1.0, 'spike_p': 0.0}), mode='tf32', device='cuda')"
REFCHECK_BUCKET_SEED=1354366037 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('varlen_equals_separate', 'fla_chunk', Case.make('gla', {'B': 1, 'H': 1, 'K': 1, 'T': 2, 'V': 1}, 'fp32', 0, seqlens=[1, 1], options={'output_final_state': False, 'scale': None}, draw={'cu_dtype': 'int32', 'gate_dtype': 'fp32', 'initial_state': False, 'mask_p': 0.0, 'normalizer': 1.0, 'spike_p': 0.0}), mode='tf32', device='cuda')"
