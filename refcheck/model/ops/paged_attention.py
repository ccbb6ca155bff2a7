"""The record of ``paged_attention`` (decode attention over a paged KV cache: vLLM, SGLang, FlashInfer).

Math, shapes and options: ``references/paged_attention.py`` (float64 truth: the pages gathered, then
attention). Budgets: ``[paged_attention.*]`` in ``tolerances.toml``. Laws: those for every op, grouped heads
and the paged laws (pages shuffled, queries one at a time), ``refcheck/engine/laws.py``.
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from refcheck import references
from refcheck.references.paged_attention import check_paged_inputs, sequence_pages

from ...strategies import EMPTY, SMALL, Limits, dtypes, head_dims_of, lengths, picker, scales, seeds
from ..case import PRECISION_MODES, Case
from ..implementation import Implementation
from .card import Grouping, Inputs, OpCard, Paging, Template, Templates, sweep_lengths
from .inputs import normal, rounded
from .linear import LINEAR_DTYPES

MLA_ABSORBED = (576, 512)
"""Dqk, Dv of MLA's absorbed decode: one latent key head of 512 dimensions and 64 of rope; values the latent."""

PAGE_SIZES = (1, 4, 16)
"""Tokens per page drawn (serving uses 16 to 64, FlashMLA 64; small pages make many pages of short caches)."""

SPARE_PAGES = 2
"""Pages of the pool that no sequence uses."""

TRITON_KNOBS = {"precision": PRECISION_MODES, "splits": (None, 1, 3)}
"""Our kernel's knobs (``optimized.paged_attention``): fp32 dot precision, key ranges per sequence (None:
planned to fill the GPU)."""

GQA_GROUPS = (1, 2, 4, 8)
"""Query heads per key head (MLA absorbed: every query head on the one latent head)."""


def layout(case: Case) -> tuple[list[int], list[list[int]], int]:
    """Where the case's cache lives: each sequence's tokens ``seqused`` (``Case.draw``), its pages in order
    (a shuffle of the pool, so that no sequence's pages are consecutive), and the pool's size (its last
    ``SPARE_PAGES`` pages in that shuffle used by no sequence). The shuffle follows the lengths and the page
    size, not the seed: integer inputs are the case's structure, and a new seed draws new values only (law
    ``inputs_rewritten`` writes them into the same tensors)."""
    page, used = case.dim["page"], list(case.drawn["seqused"])
    counts = [-(-n // page) for n in used]
    pool = sum(counts) + SPARE_PAGES
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(zlib.crc32(repr((page, used)).encode()))).tolist()
    pages, start = [], 0
    for c in counts:
        pages.append(order[start:start + c])
        start += c
    return used, pages, pool


def make_inputs(case: Case, device) -> Inputs:
    """q ``[N, Tq, H, Dqk]``, k_cache and v_cache ``[P, page, Hk, D]`` (every row drawn, used or not),
    block_table ``[N, max_pages]`` int32 (entries past a sequence's last page name a spare page) and
    seqused_k ``[N]`` int32."""
    d = case.dim
    gen = torch.Generator().manual_seed(case.seed)
    dt = case.torch_dtype
    used, pages, pool = layout(case)
    spare = sorted(set(range(pool)) - {p for named in pages for p in named})[0]
    width = max(len(p) for p in pages) + int(case.drawn.get("extra_pages", 0))
    table = torch.tensor([p + [spare] * (width - len(p)) for p in pages], dtype=torch.int32)
    tensors = {"q": rounded(normal(gen, (d["B"], d["T"], d["H"], d["Dqk"]), device), dt),
               "k_cache": rounded(normal(gen, (pool, d["page"], d["Hk"], d["Dqk"]), device), dt),
               "v_cache": rounded(normal(gen, (pool, d["page"], d["Hk"], d["Dv"]), device), dt),
               "block_table": table.to(device), "seqused_k": torch.tensor(used, dtype=torch.int32, device=device)}
    return Inputs(tensors, ("q", "k_cache", "v_cache", "block_table", "seqused_k"), case.opts)


def make_case(dims: dict, dtype: str, seed: int, seqused, *, scale=None, extra_pages: int = 0) -> Case:
    """A case of ``dims`` (B, T, H, Hk, Dqk, Dv, page) whose sequences hold ``seqused`` tokens (S: the longest)."""
    return Case.make("paged_attention", {**dims, "S": max(seqused)}, dtype, seed, options={"scale": scale},
                     draw={"seqused": tuple(int(n) for n in seqused), "extra_pages": extra_pages})


@st.composite
def cases(draw, impl=None, limits: Limits = SMALL, *, min_len: int = 1, min_batch: int = 1,
          dtype: str | None = None, grouped: bool | None = None, pinned: Mapping = EMPTY,
          declined: frozenset = frozenset()) -> Case:
    """A decode step: N sequences (``min_len`` and up to 4 queries each: one token, or a few for speculative
    decoding), GQA or MLA's absorbed shape (Hk = 1, 576/512), pages of 1, 4 or 16 tokens, caches from Tq
    tokens to several pages, sometimes more table entries than pages used."""
    pick = picker(draw, pinned)
    dt = pick("dtype", dtypes(LINEAR_DTYPES, impl, dtype))
    absorbed = impl is None or impl.head_dims is None or MLA_ABSORBED[0] in impl.head_dims
    if limits.mla and absorbed and draw(st.integers(0, 5)) == 0:
        hk, (dqk, dv) = 1, MLA_ABSORBED
    else:
        hk = pick("Hk", st.integers(1, limits.max_heads))
        dqk, dv = (pick(n, head_dims_of(impl, dt, n, limits.max_dim)) for n in ("Dqk", "Dv"))
    groups = [g for g in GQA_GROUPS if grouped is None or (g > 1) == grouped]
    h = pick("H", st.sampled_from(groups).map(lambda group: hk * group))
    n = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
    tq = pick("T", st.integers(min_len, max(min_len, 4)))
    page = pick("page", st.sampled_from(PAGE_SIZES))
    cap = max(tq, min(limits.max_len, limits.max_elements // max(1, n * hk * (dqk + dv))))
    used = draw(st.lists(lengths(tq, cap), min_size=n, max_size=n))
    dims = {"B": n, "T": tq, "H": h, "Hk": hk, "Dqk": dqk, "Dv": dv, "page": page}
    return make_case(dims, dt, draw(seeds()), used, scale=pick("scale", scales()),
                     extra_pages=draw(st.sampled_from([0, 0, 1])))


def grid(quick: bool) -> Templates:
    """One-token decode of four sequences (one token, a page exactly, a page and one, several pages) with
    GQA; speculative decoding (three queries); MLA's absorbed shape (one latent head, 576/512, pages of
    64); on a GPU, serving's head dims of 128 with longer caches; a sweep of one sequence's cache length."""
    base: list[Template]
    if quick:
        base = [("decode", dict(B=2, T=1, H=2, Hk=1, Dqk=16, Dv=8, page=4, S=9), dict(draw={"seqused": (1, 9)}))]
    else:
        base = [("decode", dict(B=4, T=1, H=4, Hk=2, Dqk=32, Dv=32, page=16, S=50),
                 dict(draw={"seqused": (1, 16, 17, 50), "extra_pages": 1})),
                ("speculative", dict(B=2, T=3, H=4, Hk=1, Dqk=32, Dv=24, page=4, S=29),
                 dict(draw={"seqused": (3, 29)}, options={"scale": 0.3})),
                ("mla_absorbed", dict(B=2, T=1, H=8, Hk=1, Dqk=576, Dv=512, page=64, S=100),
                 dict(draw={"seqused": (65, 100)})),
                # serving's shapes (GPU only): Llama 3 8B's heads, one token and speculative, pages of 16
                ("gqa_d128", dict(B=6, T=1, H=32, Hk=8, Dqk=128, Dv=128, page=16, S=1000),
                 dict(draw={"seqused": (1, 16, 17, 300, 999, 1000)}, devices=("cuda",))),
                ("speculative_d128", dict(B=3, T=4, H=32, Hk=8, Dqk=128, Dv=128, page=16, S=513),
                 dict(draw={"seqused": (4, 130, 513)}, devices=("cuda",)))]
    sweep = dict(B=1, T=1, H=2, Hk=1, Dqk=16, Dv=8, page=4) if quick else dict(B=1, T=1, H=4, Hk=1, Dqk=32, Dv=32,
                                                                               page=16)
    return base, [(f"S={s}", dict(sweep, S=s), dict(draw={"seqused": (s,)})) for s in sweep_lengths(quick)]


def used_rows(case: Case, x: Inputs) -> torch.Tensor:
    """``[P, page]`` bool: the cache rows some sequence's tokens occupy (what paging must read)."""
    page = case.dim["page"]
    used = x.tensors["seqused_k"].tolist()
    rows = torch.zeros(x.tensors["k_cache"].shape[:2], dtype=torch.bool)
    for named, length in zip(sequence_pages(x.tensors["block_table"], x.tensors["seqused_k"], page), used):
        for j, p in enumerate(named):
            rows[p, :min(page, length - j * page)] = True
    return rows


# --- peers: torch SDPA over the gathered pages ---------------------------------------------------

def sdpa_paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """torch SDPA per sequence over its pages gathered by ``index_select`` (GQA by ``enable_gqa``), the
    bottom-right causal mask as a boolean mask; no lse."""
    check_paged_inputs(q, k_cache, v_cache, block_table, seqused_k)
    spans = sequence_pages(block_table, seqused_k, k_cache.shape[1])
    n, tq = q.shape[:2]
    out = q.new_empty(*q.shape[:3], v_cache.shape[-1])
    for i, (named, length) in enumerate(zip(spans, seqused_k.tolist())):
        index = torch.tensor(named, device=q.device)
        k = k_cache.index_select(0, index).flatten(0, 1)[:length].transpose(0, 1)    # [Hk, L, Dqk]
        v = v_cache.index_select(0, index).flatten(0, 1)[:length].transpose(0, 1)
        rows = torch.arange(length - tq, length, device=q.device).unsqueeze(1)
        mask = torch.arange(length, device=q.device).unsqueeze(0) <= rows
        out[i] = F.scaled_dot_product_attention(q[i].transpose(0, 1), k, v, attn_mask=mask, scale=scale,
                                                enable_gqa=True).transpose(0, 1)
    return out, None


def flashinfer_paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """FlashInfer's paged decode (``BatchDecodeWithPagedKVCacheWrapper``, its CUDA-core kernel on Hopper) for one
    query token with Dqk == Dv, else its paged prefill (``BatchPrefillWithPagedKVCacheWrapper``, fa2; causal
    bottom-right) for speculative queries; NHD pages, the block table as FlashInfer's page list (indptr,
    indices, last page lengths). Its lse is base 2: times ln 2 (the prefill's ``lse_base="ln"``)."""
    import math

    import flashinfer
    n, tq, h, dqk = q.shape
    page, hk, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
    scale = dqk ** -0.5 if scale is None else float(scale)
    lengths = seqused_k.to(torch.int32)
    pages = (lengths + page - 1) // page
    indptr = torch.zeros(n + 1, dtype=torch.int32, device=q.device)
    indptr[1:] = torch.cumsum(pages, 0)
    named = torch.arange(block_table.shape[1], device=q.device)[None, :] < pages[:, None]
    indices = block_table.to(torch.int32)[named].contiguous()
    last = (lengths - (pages - 1) * page).to(torch.int32)
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=q.device)
    flat = q.reshape(n * tq, h, dqk).contiguous()
    if tq == 1 and dqk == dv:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(indptr, indices, last, h, hk, dqk, page, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
                     sm_scale=scale)
        o, lse = wrapper.run(flat, (k_cache, v_cache), return_lse=True)
        lse = lse * math.log(2.0)
    else:
        qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=q.device) * tq
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        wrapper.plan(qo_indptr, indptr, indices, last, h, hk, dqk, page, head_dim_vo=dv, causal=True, sm_scale=scale,
                     q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        o, lse = wrapper.run(flat, (k_cache, v_cache), return_lse=True, lse_base="ln")
    return o.view(n, tq, h, dv), lse.view(n, tq, h).permute(0, 2, 1).contiguous().float()


def fa4_paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """flash-attn-4's ``flash_attn_varlen_func`` over the pages: ``page_table`` our block table, ``seqused_k`` the
    used lengths, causal (its causal mask is bottom-right: the Tq queries are each sequence's last tokens); o
    ``[N, Tq, H, Dv]`` and its lse ``[N, H, Tq]`` (float32) as they come back for unpacked queries."""
    from flash_attn.cute import flash_attn_varlen_func
    return flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=seqused_k.to(torch.int32),
                                  page_table=block_table.to(torch.int32).contiguous(), softmax_scale=scale,
                                  causal=True, return_lse=True)


CARD = OpCard(
    "paged_attention", references.paged_attention, references.paged_attention_chunked, ("o", "lse"), (),
    LINEAR_DTYPES, make_inputs, cases=cases, traits=frozenset({"grouped_heads", "paged"}), grid=grid,
    grouping=Grouping(("k_cache", "v_cache"), "Hk", "H"), shared_inputs=("k_cache", "v_cache"),
    token_axes={"q": "q"}, join_dims={"o": 1, "lse": 2},
    paging=Paging(("k_cache", "v_cache"), "block_table", "seqused_k", used_rows),
    implementations=(
        Implementation("paged_attention", "triton", "refcheck.optimized:paged_attention", knobs=TRITON_KNOBS,
                       triton=True, backward=False,
                       description="our Triton paged decode (split-K over the keys, combined by log-sum-exp)"),
        # flashinfer-python 0.7.4: fp16/bf16 only (no fp32 kernels); head dims 128 here (it takes 64, 128, 256: each
        # dtype and head dim is a kernel nvcc compiles at first use, minutes each)
        Implementation("paged_attention", "flashinfer", "refcheck.model.ops.paged_attention:flashinfer_paged_attention",
                       devices=("cuda",), dtypes=("bf16", "fp16"), requires="flashinfer", backward=False,
                       head_dims=(128,), family="flashinfer",
                       description="FlashInfer's paged decode (one token) and paged prefill (speculative queries)"),
        # flash-attn-4 4.0.0b36 on SM90: fp16/bf16, head dims up to 256 (it asserts "between 8 and 256"), and over pages
        # that are not one key tile (128 tokens) multiples of 16 ("Paged KV does not support irregular head dim": Dv=24
        # asserts); MLA's absorbed 576/512 is left out for it
        Implementation("paged_attention", "fa4", "refcheck.model.ops.paged_attention:fa4_paged_attention",
                       devices=("cuda",), dtypes=("bf16", "fp16"), requires="flash_attn", backward=False,
                       head_dims=tuple(range(16, 257, 16)),
                       description="flash-attn-4 (CUTLASS DSL) over the pages: page_table and seqused_k"),
        Implementation("paged_attention", "sdpa", "refcheck.model.ops.paged_attention:sdpa_paged_attention",
                       outputs=("o",), backward=False,
                       description="torch scaled_dot_product_attention over the gathered pages (no lse)"),
    ))
