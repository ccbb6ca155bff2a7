"""Decode attention over a paged KV cache (vLLM, SGLang, FlashInfer; FlashMLA's absorbed MLA shape).

Serving keeps each sequence's keys and values in fixed-size pages of one pool. Sequence n has
``L_n = seqused_k[n]`` tokens; its token j lives in page ``block_table[n, j // page]`` at row
``j % page``. A decode step brings the last ``Tq`` tokens of each sequence as queries (one, or a few
for speculative decoding): query i is token ``L_n - Tq + i`` and sees keys ``0 .. L_n - Tq + i``
(causal, bottom-right). Gathered into one contiguous sequence, that is attention (``attention.py``):

    o[n, i] = softmax_j(scale q[n, i] . k_j) v_j,   lse[n, :, i] = log sum_j exp(scale q[n, i] . k_j)

Shapes: q ``[N, Tq, H, Dqk]``; k_cache ``[P, page, Hk, Dqk]`` and v_cache ``[P, page, Hk, Dv]`` (P pages of
``page`` tokens, Hk key heads, H a multiple of Hk: GQA); block_table ``[N, max_pages]`` int32 or int64;
seqused_k ``[N]`` int32 or int64 with ``1 <= Tq <= L_n <= max_pages * page``. Entries of the block table
past a sequence's last page are never read (any value), nor are the rows of its last page past ``L_n``.
MLA decodes in its absorbed form: one latent key head (Hk = 1), Dqk = 576 (512 latent + 64 rope), Dv = 512.
Returns ``(o [N, Tq, H, Dv], lse [N, H, Tq])``, computed in ``q.dtype``; a kernel's dtypes are the
contract's: o in the input dtype, lse in float32.
"""
from __future__ import annotations

import torch

from .attention import attention, attention_chunked
from .contract import check_scale, check_shape, check_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k) -> None:
    """Validate a paged decode call (one host synchronization: the checks of the block table and the lengths
    run on their device, then one boolean is read)."""
    check_tensor("q", q, 4)
    n, tq, h, dqk = q.shape
    check_tensor("k_cache", k_cache, 4)
    pages, page, hk = k_cache.shape[:3]
    if k_cache.shape[3] != dqk:
        raise ValueError(f"k_cache: expected shape [P, page, Hk, Dqk] with q's Dqk = {dqk}, got {tuple(k_cache.shape)}")
    if hk == 0 or h % hk:
        raise ValueError(f"k_cache: expected Hk dividing q's H = {h} (GQA), got Hk = {hk}")
    check_tensor("v_cache", v_cache, 4)
    check_shape("v_cache", v_cache, (pages, page, hk, v_cache.shape[3]), "[P, page, Hk, Dv] like k_cache")
    check_tensor("block_table", block_table, 2, INDEX_DTYPES)
    if block_table.shape[0] != n:
        raise ValueError(f"block_table: expected shape [N, max_pages] with N = {n} (q's sequences), "
                         f"got {tuple(block_table.shape)}")
    check_tensor("seqused_k", seqused_k, 1, INDEX_DTYPES)
    check_shape("seqused_k", seqused_k, (n,), "[N]: each sequence's tokens in the cache")
    width = block_table.shape[1]
    lengths_ok = (seqused_k >= tq) & (seqused_k <= width * page)
    named = torch.arange(width, device=block_table.device)[None, :] < ((seqused_k + page - 1) // page)[:, None]
    pages_ok = ((block_table >= 0) & (block_table < pages)) | ~named
    if bool(lengths_ok.all() & pages_ok.all()):
        return
    for i, (length, row) in enumerate(zip(seqused_k.tolist(), block_table.tolist())):    # say which, and why
        if not tq <= length <= width * page:
            raise ValueError(f"seqused_k: sequence {i} has {length} tokens; expected at least q's Tq = {tq} (its "
                             f"queries are its last tokens) and at most max_pages * page = {width * page}")
        bad = [p for p in row[:-(-length // page)] if not 0 <= p < pages]
        if bad:
            raise ValueError(f"block_table: sequence {i} names pages {bad}; expected pages of the pool, in [0, {pages})")


def sequence_pages(block_table, seqused_k, page: int) -> list[list[int]]:
    """Each sequence's pages in order (those its tokens use), read on the host."""
    return [row[:-(-length // page)] for row, length in zip(block_table.tolist(), seqused_k.tolist())]


def _gathered(q, k_cache, v_cache, block_table, seqused_k, scale, form):
    """Every sequence's pages gathered into one packed batch, then ``form`` (causal, bottom-right)."""
    check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k)
    spans = sequence_pages(block_table, seqused_k, k_cache.shape[1])
    n, tq, h, _ = q.shape
    scale = check_scale(scale, q.shape[-1])
    lengths = seqused_k.tolist()
    k = torch.cat([k_cache[pages].flatten(0, 1)[:length] for pages, length in zip(spans, lengths)])
    v = torch.cat([v_cache[pages].flatten(0, 1)[:length] for pages, length in zip(spans, lengths)])
    cu_q = torch.arange(0, (n + 1) * tq, tq, dtype=torch.int64)
    cu_k = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    o, lse = form(q.reshape(1, n * tq, h, q.shape[-1]), k.unsqueeze(0), v.unsqueeze(0), causal=True, scale=scale,
                  cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    return o.reshape(n, tq, h, v.shape[-1]), lse.reshape(h, n, tq).transpose(0, 1)


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """Paged decode attention evaluated in ``q.dtype`` (float64 for the truth): the pages gathered, then
    ``attention``'s dense form. Returns ``(o [N, Tq, H, Dv], lse [N, H, Tq])``."""
    return _gathered(q, k_cache, v_cache, block_table, seqused_k, scale, attention)


def paged_attention_chunked(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """The same in ``attention``'s flash form (keys in blocks of 64, an online softmax): same contract and
    result as ``paged_attention`` (to rounding)."""
    return _gathered(q, k_cache, v_cache, block_table, seqused_k, scale, attention_chunked)
