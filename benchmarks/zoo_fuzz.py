"""The false-alarm measure: ``refcheck fuzz`` over every correct member of the zoo (``tests/zoo``: kernels
written from other formulas than refcheck's references), each for ``--seconds`` per seed; any
counterexample there is a false alarm of refcheck's.

    python benchmarks/zoo_fuzz.py --seconds 60 --seeds 1,2,3 --out benchmarks/results/zoo_fuzz_cpu.json

Per member and seed: the exit status (0 no counterexample, 1 falsified), the examples run and the laws
searched, from the command's own summary line; the reproducers of any finding are kept in ``--work``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from monte_carlo_factors import MEMBERS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--ops", default=",".join(MEMBERS), help="comma-separated ops")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/zoo-fuzz"))
    args = parser.parse_args()
    runs = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for op in args.ops.split(","):
        names = MEMBERS[op]
        module = "attention" if op == "attention" else "linear"
        for name in names:
            for seed in args.seeds.split(","):
                work = args.work / f"{name}-{seed}"
                work.mkdir(parents=True, exist_ok=True)
                command = [sys.executable, "-m", "refcheck", "fuzz", op, "--impl", f"{op}=tests.zoo.{module}:{name}",
                           "--seconds", f"{args.seconds:g}", "--seed", seed, "--device", "cpu", "--out-dir", str(work),
                           "--database", str(work / "db")]
                began = time.monotonic()
                done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
                text = done.stdout + done.stderr
                counted = re.search(r"(?:no counterexample in|falsified \() ?(\d+) examples?", text)
                laws = re.search(r"(\d+) laws?", text)
                falsified = re.findall(r"law (\w+) \(\S+\) falsified", text)
                runs.append({"op": op, "member": name, "seed": int(seed), "status": done.returncode,
                             "examples": int(counted.group(1)) if counted else None,
                             "laws": int(laws.group(1)) if laws else None, "falsified": falsified,
                             "seconds": round(time.monotonic() - began, 1)})
                print(json.dumps(runs[-1]), flush=True)
                (work / "output.txt").write_text(text)
    found = [r for r in runs if r["status"] != 0]
    print(f"{len(runs)} runs, {sum(r['examples'] or 0 for r in runs)} examples, {len(found)} with a finding")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "seconds_per_run": args.seconds,
                                        "runs": runs, "false_alarms": len(found)}, indent=1) + "\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
