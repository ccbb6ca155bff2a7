"""``refcheck contract OP``: what a kernel of ``OP`` is called with and must return.

All of it is read from what refcheck itself checks against: the signature of the op's float64 reference
(``refcheck.model.ops.card(OP).reference``: required parameters by position, the others by keyword),
the card's input dtypes, the output dtypes of ``refcheck.engine.verify.output_dtype`` (``o`` in the
input dtype, every other output float32), the default scale of ``refcheck.references.contract.check_scale``,
the card's rule for an empty sequence (``empty_outputs``) and law 11's for rows without keys, the
extensions a kernel may decline (``OpCard.extensions``), each
input's dtype as the grid hands it over, the laws that concern the op (first sentence of each), the
tensors of a grid case, and the reference's module and function docstrings (shapes and math).
``--json`` prints the same as JSON.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re
import textwrap

import torch

from ..engine import grid
from ..engine.laws import LAWS
from ..engine.verify import output_dtype
from ..model.case import DTYPES, PRECISION_MODES, Case
from ..model.ops import OPS, OpCard
from ..references.contract import check_scale
from .cli import UsageError
from .selection import load_op_cards

INPUT_DTYPE = "the input dtype"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("contract", help="an op's contract: signature, shapes, dtypes, scale, edge cases",
                              description=__doc__.splitlines()[0])
    p.add_argument("op", help="the op (refcheck list shows them)")
    p.add_argument("--op-card", action="append", default=[], metavar="MODULE:ATTR",
                   help="an op refcheck does not know: module:attr naming its refcheck.model.ops.OpCard")
    p.add_argument("--json", action="store_true", help="print the contract as JSON")
    p.set_defaults(run=run)


def signature(fn) -> inspect.Signature:
    """``fn``'s signature without annotations: what a caller passes."""
    sig = inspect.signature(fn)
    return sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()],
                       return_annotation=inspect.Signature.empty)


def torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def output_dtypes(c: OpCard) -> dict[str, str]:
    """Each output's contract dtype: ``the input dtype`` or a torch name (``float32``)."""
    found = {}
    for name in c.outputs:
        got = {d: output_dtype(Case.make(c.name, {}, d, 0), name) for d in c.dtypes}
        if all(got[d] == DTYPES[d] for d in c.dtypes):
            found[name] = INPUT_DTYPE
        else:
            found[name] = ", ".join(dict.fromkeys(f"{d} -> {torch_name(t)}" for d, t in got.items()))
            if len(set(got.values())) == 1:
                found[name] = torch_name(next(iter(got.values())))
    return found


def first_paragraph(doc: str | None) -> str:
    return " ".join((inspect.cleandoc(doc or "").split("\n\n") or [""])[0].split())


def edge_cases(c: OpCard) -> list[str]:
    """The op's rules for degenerate inputs, from the card and the laws that hold kernels to them."""
    rules = []
    if c.empty_outputs is not None:
        rules.append(first_paragraph(c.empty_outputs.__doc__))
    if "keys" in c.traits:
        law = re.sub(r"^Law [\d, ]+:\s*", "", first_paragraph(LAWS["rows_without_keys"].doc))
        rules.append(f"Law rows_without_keys: {law}")
    if "state" in c.traits:
        rules.append("initial_state=None: every sequence starts from a zero state; final_state is None unless "
                     "output_final_state=True")
    return rules


def input_dtypes(c: OpCard) -> dict[str, str]:
    """Each tensor input's dtype, as the grid's base cases of every input dtype hand it over (with every
    gate dtype the cases draw, for an op whose gates have their own): ``the input dtype``, a torch name,
    ``the input dtype or float32``, or any of the op's dtypes whatever the input dtype."""
    if c.grid is None:
        return {}
    seen: dict[str, set[tuple[str, str]]] = {}    # tensor -> {(input dtype, its dtype)}
    for entry in grid.cases(c.name):
        if entry.sweep:
            continue
        variants = [entry.case]
        if c.understands("gate_dtype"):
            variants += [dataclasses.replace(entry.case, draw=tuple(sorted({**dict(entry.case.draw), "gate_dtype": d}.items())))
                         for d in c.dtypes]
        for case in variants:
            for name, t in c.make_inputs(case, torch.device("cpu")).tensors.items():
                seen.setdefault(name, set()).add((case.dtype, torch_name(t.dtype)))
    found = {}
    for name, pairs in seen.items():
        own = {dtype for _, dtype in pairs}
        if name.startswith("cu_seqlens") and "varlen" in c.traits:
            found[name] = "int32 or int64"
        elif all(torch_name(DTYPES[case]) == dtype for case, dtype in pairs):
            found[name] = INPUT_DTYPE
        elif len(own) == 1:
            found[name] = own.pop()
        elif own >= {torch_name(DTYPES[d]) for d in c.dtypes} and len({case for case, _ in pairs}) > 1:
            found[name] = f"any of {', '.join(sorted(own))}, whatever the input dtype"
        else:
            other = sorted(own - {torch_name(DTYPES[case]) for case, _ in pairs})
            found[name] = f"{INPUT_DTYPE} or {' or '.join(other)}"
    return found


def layout_rules(c: OpCard) -> list[str]:
    """What a kernel must accept of a tensor's memory and of packed sequences."""
    rules = ["Inputs may be non-contiguous views with a storage offset (any strides, unit stride in the last "
             "dimension): read them through their strides, or copy them (law reads_past_input). Never write to "
             "an input (law no_side_effects)."]
    if "state_pool" in c.traits:
        rules.append("The one write the contract allows: with ssm_state_indices and inplace_final_state=True, each "
                     "sequence's final state into its slot of the pool given as initial_state, and nothing else "
                     "(law state_pool).")
    if "paged" in c.traits:
        rules.append("A paged cache is read through the block table: cache rows past a sequence's tokens, and "
                     "pages no sequence uses, may hold anything, NaN included (law pages_shuffled).")
    if "varlen" in c.traits:
        lengths = "from 0 to its packed length (T for queries, S for keys)" if "keys" in c.traits else "from 0 to T"
        alone = "its own causal alignment, its rows without keys" if "keys" in c.traits else "its own initial and final state"
        names = "cu_seqlens_q and cu_seqlens_k" if "keys" in c.traits else "cu_seqlens"
        rules.append(f"Packed sequences: B == 1 and {names} [N + 1] (int32 or int64), non-decreasing {lengths}: "
                     "sequence n is rows cu_seqlens[n]:cu_seqlens[n + 1] and may be empty; N is the number of "
                     f"sequences (B unless packed). Each sequence is computed as if alone: {alone} "
                     "(law varlen_equals_separate).")
    return rules


def upstream_rule(c: OpCard) -> str:
    """Which outputs the backward receives a gradient for (an op with no differentiable input: none)."""
    if not c.differentiable:
        return "Forward only: no input of the op is differentiable, and no backward is called."
    return (f"The backward receives a random upstream gradient for every output returned ({', '.join(c.outputs)}), "
            "zero where an output is not finite; gradients in the dtype of their input.")


def laws_of(c: OpCard) -> list[dict]:
    """The laws that concern the op (its traits), with the first sentence of each."""
    found = []
    for law in LAWS.values():
        if law.why_not_op(c) is None:
            body = re.sub(r"^Law [\d, ]+(\([^)]*\))?:\s*", "", first_paragraph(law.doc))
            sentence = re.split(r"(?<=\.)\s+(?=[A-Z])", body, maxsplit=1)[0]
            found.append({"law": law.name, "says": sentence.rstrip(".") + "."})
    return found


def examples(c: OpCard) -> list[dict]:
    """The tensors of the op's first grid case, of its first packed one, and of the first with a dim the
    first case lacks (grouped value heads' ``HV``): what a kernel receives."""
    if c.grid is None:
        return []
    base = [e for e in grid.cases(c.name) if not e.sweep and e.case.dtype == c.dtypes[0]]
    chosen = base[:1] + [e for e in base[1:] if e.case.seqlens is not None][:1]
    chosen += [e for e in base[1:] if set(e.case.dim) - set(base[0].case.dim)][:1] if base else []
    found = []
    for entry in chosen:
        x = c.make_inputs(entry.case, torch.device("cpu"))
        with torch.no_grad():
            out = c.split(x.call(c.reference))
        found.append({
            "case": entry.case.describe(), "label": entry.label,
            "inputs": {n: {"shape": list(t.shape), "dtype": torch_name(t.dtype),
                           "positional": n in x.positional} for n, t in x.tensors.items()},
            "options": {k: v for k, v in x.options.items()},
            "outputs": {n: {"shape": list(t.shape)} for n, t in out.items()}})
    return found


def contract(c: OpCard) -> dict:
    """The contract of op card ``c`` as plain data (the ``--json`` layout)."""
    ref = c.reference
    sig = signature(ref)
    params = [{"name": p.name, "required": p.default is inspect.Parameter.empty,
               "by": "keyword" if p.kind is inspect.Parameter.KEYWORD_ONLY else "position",
               "default": None if p.default is inspect.Parameter.empty else p.default}
              for p in sig.parameters.values()]
    module = inspect.getmodule(ref)
    return {
        "op": c.name, "reference": f"{ref.__module__}:{ref.__qualname__}",
        "signature": f"{ref.__name__}{sig}", "parameters": params,
        "precision": f"a callable that takes a 'precision' keyword gets the precision mode ({', '.join(PRECISION_MODES)})",
        "dtypes_in": list(c.dtypes), "torch_dtypes_in": [str(DTYPES[d]) for d in c.dtypes],
        "inputs": input_dtypes(c),
        "outputs": output_dtypes(c),
        "gradients": {c.grad_name(n): n for n in c.differentiable},
        "upstream": upstream_rule(c),
        "layouts": layout_rules(c),
        "laws": laws_of(c),
        "default_scale": (f"scale=None: q.shape[-1] ** -0.5 (head dim 64: {check_scale(None, 64)}); a given scale "
                          "must be positive (refcheck.references.contract.check_scale)") if "scale" in sig.parameters else None,
        "edge_cases": edge_cases(c),
        "extensions": [{"name": e.name, "keywords": list(e.keywords), "meaning": e.meaning} for e in c.extensions],
        "examples": examples(c),
        "module": ref.__module__, "module_doc": (inspect.getdoc(module) or "") if module else "",
        "doc": inspect.getdoc(ref) or "",
    }


def text(info: dict) -> str:
    """The contract for a terminal."""
    def block(body: str) -> str:
        return textwrap.indent(body, "  ")

    def para(body: str) -> str:
        return textwrap.fill(body, 110, initial_indent="  ", subsequent_indent="    ")
    required = [p["name"] for p in info["parameters"] if p["required"]]
    lines = [f"{info['op']}: the contract of its float64 reference {info['reference']}", "",
             "signature", block(info["signature"]),
             para(f"{', '.join(required)} by position, the rest by keyword (**options takes them all); "
                  f"{info['precision']}"), "",
             "dtypes",
             block(f"the input dtype: {', '.join(info['dtypes_in'])} ({', '.join(info['torch_dtypes_in'])})"),
             *(block(f"  {n:<14} {d}") for n, d in info["inputs"].items()),
             block("outputs:   " + "; ".join(f"{n} in {d}" for n, d in info["outputs"].items())),
             block("gradients: " + ", ".join(f"{g} (of {n})" for g, n in info["gradients"].items())
                   if info["gradients"] else "gradients: none"),
             para(info["upstream"]), "",
             "layouts", *map(para, info["layouts"]), ""]
    if info["default_scale"]:
        lines += ["default scale", para(info["default_scale"]), ""]
    if info["edge_cases"]:
        lines += ["edge cases", *map(para, info["edge_cases"]), ""]
    if info["extensions"]:
        lines += ["extensions", para("A kernel may decline each of these: its signature takes none of the "
                                     "extension's keywords, or its Implementation record names it (declines=...); "
                                     "cases that use it are then neither drawn nor run for that kernel."),
                  *(para(f"{e['name']}: {e['meaning']}" + (f" (keywords {', '.join(e['keywords'])})" if e["keywords"]
                                                           else "")) for e in info["extensions"]), ""]
    if info["laws"]:
        lines += ["laws it is held to (refcheck.engine.laws; a law that needs a knob or layout a kernel lacks is n/a)",
                  *(para(f"{law['law']}: {law['says']}") for law in info["laws"]), ""]
    for ex in info["examples"]:
        lines.append(f"example: grid case '{ex['label']}': {ex['case']}")
        for name, t in ex["inputs"].items():
            how = "positional" if t["positional"] else "keyword"
            lines.append(block(f"{name:<16} {str(t['shape']):<18} {t['dtype']:<9} {how}"))
        if ex["options"]:
            lines.append(block("options: " + ", ".join(f"{k}={v!r}" for k, v in ex["options"].items())))
        lines.append(block("returns: " + ", ".join(f"{n} {o['shape']} in {info['outputs'].get(n, '?')}"
                                                    for n, o in ex["outputs"].items())))
        lines.append("")
    lines += [f"shapes and math ({info['module']})", block(info["module_doc"]), "",
              info["reference"], block(info["doc"])]
    return "\n".join(lines)


def run(args) -> int:
    load_op_cards(args.op_card)
    if args.op not in OPS:
        raise UsageError(f"contract {args.op}: unknown op; known ops: {', '.join(OPS)}")
    info = contract(OPS[args.op])
    print(json.dumps(info, indent=2, default=repr) if args.json else text(info))
    return 0
