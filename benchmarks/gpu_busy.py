"""How busy each GPU was in each phase of a run: the summary of an ``nvidia-smi`` sampling log.

``benchmarks/gpu.sh multi-gpu`` samples every GPU while it runs the same law run on one GPU
and then on all of them (``nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used
--format=csv,noheader,nounits -lms 500``) and writes a phase file, one ``START|END NAME`` line with
``date '+%Y/%m/%d %H:%M:%S.%N'`` at each boundary. This prints, per phase and GPU: the samples, the
mean utilization (the share of the sample period in which a kernel ran, as nvidia-smi defines it),
the share of samples in which the GPU was busy at all, and the peak memory in use; and per phase, the
share of sampling rounds in which every GPU was busy at once (a round: one line per GPU, in index order)::

    python benchmarks/gpu_busy.py SMI.csv PHASES.txt [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
from datetime import datetime

STAMP = "%Y/%m/%d %H:%M:%S.%f"


def stamp(text: str) -> datetime:
    """nvidia-smi's timestamp (milliseconds) or ``date +%N``'s (nanoseconds, cut to microseconds)."""
    day, _, clock = text.strip().partition(" ")
    whole, _, frac = clock.partition(".")
    return datetime.strptime(f"{day} {whole}.{(frac or '0')[:6]}", STAMP)


def samples(path: str) -> list[tuple[datetime, int, float, float]]:
    """(time, GPU index, utilization %, memory used MiB) per line of the nvidia-smi log; lines it
    could not measure (``[N/A]``, a header) are left out."""
    rows = []
    for line in open(path):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        try:
            rows.append((stamp(fields[0]), int(fields[1]), float(fields[2]), float(fields[3])))
        except ValueError:
            continue
    return rows


def phases(path: str) -> list[tuple[str, datetime, datetime]]:
    """(name, start, end) of every phase with both lines in the phase file."""
    starts, found = {}, []
    for line in open(path):
        word, _, rest = line.strip().partition(" ")
        when, _, name = rest.rpartition(" ")
        if word == "START":
            starts[name] = stamp(when)
        elif word == "END" and name in starts:
            found.append((name, starts.pop(name), stamp(when)))
    return found


def rounds(rows) -> list[list]:
    """The sampling rounds of the log: nvidia-smi writes one line per GPU, index 0 first."""
    found: list[list] = []
    for r in rows:
        if r[1] == 0 or not found:
            found.append([])
        found[-1].append(r)
    return found


def summary(rows, spans) -> list[dict]:
    """One entry per phase and GPU, then one per phase for all GPUs at once (gpu ``"all"``)."""
    out = []
    gpus = len({r[1] for r in rows})
    for name, start, end in spans:
        inside = [r for r in rows if start <= r[0] <= end]
        whole = [rd for rd in rounds(inside) if len(rd) == gpus]
        for gpu in sorted({r[1] for r in rows}):
            mine = [r for r in inside if r[1] == gpu]
            util = [r[2] for r in mine]
            out.append(dict(phase=name, seconds=round((end - start).total_seconds(), 1), gpu=gpu, samples=len(mine),
                            mean_util=round(sum(util) / len(util), 1) if util else None,
                            busy_share=round(sum(u > 0 for u in util) / len(util), 3) if util else None,
                            peak_mib=max((r[3] for r in mine), default=None)))
        if gpus > 1:
            out.append(dict(phase=name, seconds=round((end - start).total_seconds(), 1), gpu="all", samples=len(whole),
                            mean_util=None, peak_mib=None,
                            busy_share=round(sum(all(r[2] > 0 for r in rd) for rd in whole) / len(whole), 3)
                            if whole else None))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("smi", help="the nvidia-smi log (timestamp, index, utilization.gpu, memory.used; csv, noheader, nounits)")
    p.add_argument("phases", help="the phase file (START|END TIMESTAMP NAME lines)")
    p.add_argument("--json", default=None, help="also write the table here")
    args = p.parse_args()
    table = summary(samples(args.smi), phases(args.phases))
    print(f"{'phase':<28} {'s':>6} {'gpu':>3} {'samples':>7} {'mean util %':>11} {'busy':>6} {'peak MiB':>9}")
    for r in table:
        util = "-" if r["mean_util"] is None else f"{r['mean_util']:.1f}"
        busy = "-" if r["busy_share"] is None else f"{100 * r['busy_share']:.0f}%"
        print(f"{r['phase']:<28} {r['seconds']:>6.0f} {r['gpu']:>3} {r['samples']:>7} {util:>11} {busy:>6} "
              f"{r['peak_mib'] if r['peak_mib'] is not None else '-':>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
