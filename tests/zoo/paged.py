"""Paged decode attention written from another formula than the reference's (which gathers the pages, then
attends): split-K decoding (FlashDecoding, the form of serving's decode kernels), with a buggy twin.

User kernels (not registered): ``--impl paged_attention=tests.zoo.paged:NAME``, with the contract signature
``f(q, k_cache, v_cache, block_table, seqused_k, *, scale=None)``:

    q [N, Tq, H, Dqk], k_cache [P, page, Hk, Dqk], v_cache [P, page, Hk, Dv], block_table [N, max_pages],
    seqused_k [N]; query i of sequence n is its token L_n - Tq + i and sees keys 0 .. L_n - Tq + i;
    returns o [N, Tq, H, Dv] in q.dtype and lse [N, H, Tq] in float32.

Per sequence, the pages it uses are read one split of ``pages`` pages at a time, straight from the pool
through the block table, the rows of its last page past its tokens loaded as 0 (as kernels mask loads:
those rows are memory the sequence does not own, and may hold anything). Each split s, over its keys j,
forms in fp32 from the input-dtype operands

    m_s = max_j s_ij,   l_s = sum_j exp(s_ij - m_s),   acc_s = sum_j exp(s_ij - m_s) v_j

(a split whose keys the row may not see has m_s = -inf and contributes nothing), and the splits are
combined by their log-sum-exp: ``lse = log sum_s exp(m_s + log l_s)``, ``o = sum_s exp(m_s - lse) acc_s``.
``p_in_dtype`` rounds each split's weights to the input dtype before ``P V``, as tensor-core kernels do.
"""
from __future__ import annotations

import torch

from refcheck.references.contract import check_scale
from refcheck.references.paged_attention import check_paged_inputs, sequence_pages

COMPUTE = torch.float32


def _split_k(q, k_cache, v_cache, block_table, seqused_k, scale, *, pages: int, p_in_dtype: bool = False,
             rescale: bool = True):
    check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k)
    spans = sequence_pages(block_table, seqused_k, k_cache.shape[1])
    n, tq, h, dqk = q.shape
    hk, page = k_cache.shape[2], k_cache.shape[1]
    scale = check_scale(scale, dqk)
    heads = torch.arange(h, device=q.device) // (h // hk)
    o = torch.empty(n, tq, h, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(n, h, tq, dtype=COMPUTE, device=q.device)
    for seq, (named, length) in enumerate(zip(spans, seqused_k.tolist())):
        qi = q[seq].to(COMPUTE).transpose(0, 1)                                  # [H, Tq, Dqk]
        last = torch.arange(length - tq, length, device=q.device)                # each query's last key
        ms, ls, accs = [], [], []
        for first in range(0, len(named), pages):
            index = torch.tensor(named[first:first + pages], device=q.device)
            keys = torch.arange(first * page, (first + len(index)) * page, device=q.device)
            held = (keys < length).view(-1, 1, 1)       # rows past the sequence's tokens: loaded as 0, as kernels mask
            k = torch.where(held, k_cache[index].flatten(0, 1), 0)[:, heads].to(COMPUTE).transpose(0, 1)  # [H, keys, Dqk]
            v = torch.where(held, v_cache[index].flatten(0, 1), 0)[:, heads].transpose(0, 1)
            s = (qi @ k.transpose(1, 2)) * scale
            s = s.masked_fill(~((keys[None, :] <= last[:, None]) & (keys[None, :] < length)), float("-inf"))
            m = s.amax(-1, keepdim=True)
            p = torch.where(torch.isinf(m), 0.0, torch.exp(s - m))
            ms.append(m)
            ls.append(p.sum(-1, keepdim=True))
            accs.append((p.to(q.dtype) @ v).to(COMPUTE) if p_in_dtype else p @ v.to(COMPUTE))
        m = torch.cat(ms, -1)                                                    # [H, Tq, splits]
        split_lse = m + torch.log(torch.cat(ls, -1))
        total = torch.logsumexp(split_lse, -1, keepdim=True)
        weights = torch.exp(m - total) if rescale else torch.exp(m - m.amax(-1, keepdim=True))
        weights = torch.where(torch.isinf(m), 0.0, weights)
        out = sum(weights[..., i:i + 1] * accs[i] for i in range(len(accs)))
        if not rescale:          # the bug: each split's l summed without its weight exp(m_s - max m)
            out = out / torch.cat(ls, -1).sum(-1, keepdim=True)
        o[seq] = out.transpose(0, 1).to(q.dtype)
        lse[seq] = total.squeeze(-1)
    return o, lse


def split_k_one_page(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """Split-K over one page per split, fp32 weights (module docstring)."""
    return _split_k(q, k_cache, v_cache, block_table, seqused_k, scale, pages=1)


def split_k_three_pages_p_input(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """Split-K over three pages per split, each split's weights rounded to the input dtype before P V."""
    return _split_k(q, k_cache, v_cache, block_table, seqused_k, scale, pages=3, p_in_dtype=True)


def bug_split_k_combined_by_running_max(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """BUG: the splits' accumulators weighted by exp(m_s - max m) but normalized by the splits' l summed
    without those weights (a rescale dropped in the combine): right when one split holds every key."""
    return _split_k(q, k_cache, v_cache, block_table, seqused_k, scale, pages=1, rescale=False)
