#!/usr/bin/env bash
# flash-attn-4 4.0.0b36 over a paged KV cache on an H200 (torch 2.11, `flash_attn_varlen_func` with page_table and
# seqused_k through refcheck's adapter, paged_attention/fa4): the law run (gpu_properties_paged_attention_fa4_h200.txt)
# lost the CUDA context, "an illegal memory access was encountered", in every law at the one compile bucket it drew
# with pages of 1 token, Dqk=16 and Dv=64 (8 query heads on 2 key heads, bf16). The report's grid (pages of 16,
# Dqk = Dv = 32 and 128) holds: 51/51 grid points, 20/20 law checks (gpu_report_paged_attention_h200.txt). Which of
# the page size and Dqk != Dv makes the crash is not separated yet (the probes at the end). `REPLAY=benchmarks/results/gpu_findings_fa4_paged_h200.sh
# bash benchmarks/gpu.sh replay` says whether each still fails.
#
# one token cached, one query
REFCHECK_BUCKET_SEED=2067323409 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fa4', Case.make('paged_attention', {'B': 1, 'Dqk': 16, 'Dv': 64, 'H': 8, 'Hk': 2, 'S': 1, 'T': 1, 'page': 1}, 'bf16', 0, options={'scale': None}, draw={'extra_pages': 0, 'seqused': (1,)}), mode='ieee', device='cuda')"
# 65 tokens cached, 65 queries
REFCHECK_BUCKET_SEED=2067323409 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fa4', Case.make('paged_attention', {'B': 1, 'Dqk': 16, 'Dv': 64, 'H': 8, 'Hk': 2, 'S': 65, 'T': 65, 'page': 1}, 'bf16', 0, options={'scale': None}, draw={'extra_pages': 0, 'seqused': (65,)}), mode='ieee', device='cuda')"
#
# Probes that separate the two (not findings yet; each holds with SDPA on the CPU): the same 65 tokens with
# Dqk = Dv = 64 on pages of 1 token, Dqk=16/Dv=64 on pages of 16, Dqk = Dv = 16 on pages of 1
REFCHECK_BUCKET_SEED=2067323409 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fa4', Case.make('paged_attention', {'B': 1, 'Dqk': 64, 'Dv': 64, 'H': 8, 'Hk': 2, 'S': 65, 'T': 65, 'page': 1}, 'bf16', 0, options={'scale': None}, draw={'extra_pages': 0, 'seqused': (65,)}), mode='ieee', device='cuda')"
REFCHECK_BUCKET_SEED=2067323409 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fa4', Case.make('paged_attention', {'B': 1, 'Dqk': 16, 'Dv': 64, 'H': 8, 'Hk': 2, 'S': 65, 'T': 65, 'page': 16}, 'bf16', 0, options={'scale': None}, draw={'extra_pages': 0, 'seqused': (65,)}), mode='ieee', device='cuda')"
REFCHECK_BUCKET_SEED=2067323409 python -c "from refcheck.engine.reproduce import law; from refcheck.model.case import Case; law('agreement', 'fa4', Case.make('paged_attention', {'B': 1, 'Dqk': 16, 'Dv': 16, 'H': 8, 'Hk': 2, 'S': 65, 'T': 65, 'page': 1}, 'bf16', 0, options={'scale': None}, draw={'extra_pages': 0, 'seqused': (65,)}), mode='ieee', device='cuda')"
