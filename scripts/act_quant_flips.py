#!/usr/bin/env python3
"""How often do the fast path and the fp32 reference leave the fp64 reference beyond fp32 noise?

For each seed: make a tiny checkpoint, draw a random prompt, run `dsv41 logits` three times in the
same --act-quant mode (reference fp64 -> .f64, reference fp32 -> .f32, fast -> .f32) and compute,
per row, the relative L2 distance ||x - ref64|| / ||ref64||. A case counts as "far" when its worst
row over the prompt exceeds --far (default 1e-5, well above fp32 summation noise ~1e-7).

If the fast path leaves fp64 about as often as the fp32 reference does, its extra distance is the
order of fp32 sums flipping E4M3 roundings; if it is systematically far where the fp32 reference is
not, a rule differs. To see which rounding flipped in the reference, run `dsv41 explain --act-quant
on` on a case's tokens (printed with --json). Only the CLI and Debian's python3 are needed; not
part of CI. Results: docs/decisions.md ("act-quant flips, measured").

  python3 scripts/act_quant_flips.py --dsv41 build/src/cli/dsv41 --seeds 1-40 --act-quant on
  python3 scripts/act_quant_flips.py --dsv41 build/src/cli/dsv41 --seeds 1-40 --act-quant off
"""
import argparse
import array
import json
import math
import os
import random
import subprocess
import sys
import tempfile


def read_rows(path, vocab):
    typecode = "d" if path.endswith(".f64") else "f"
    data = array.array(typecode)
    with open(path, "rb") as f:
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()
    return [data[i * vocab:(i + 1) * vocab] for i in range(len(data) // vocab)]


def rel_l2(x, ref):
    num = math.fsum((a - b) ** 2 for a, b in zip(x, ref))
    den = math.fsum(b * b for b in ref)
    return math.sqrt(num / den) if den > 0 else float("inf")


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])


def parse_seeds(s):
    out = []
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsv41", default="build/src/cli/dsv41")
    ap.add_argument("--seeds", default="1-20", help="checkpoint seeds, e.g. 1-40 or 3,7,9")
    ap.add_argument("--prompt-seed", type=int, default=0, help="added to the seed to draw the prompt")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--act-quant", choices=["on", "off"], default="on")
    ap.add_argument("--far", type=float, default=1e-5)
    ap.add_argument("--work", default=None, help="keep checkpoints and logits here (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="one JSON line per case")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="aqflips-")
    os.makedirs(work, exist_ok=True)
    cases = []
    for seed in parse_seeds(args.seeds):
        model = os.path.join(work, "tiny-%d" % seed)
        if not os.path.exists(os.path.join(model, "config.json")):
            run([args.dsv41, "make-tiny", "--out", model, "--preset", args.preset, "--seed", str(seed)])
        with open(os.path.join(model, "config.json")) as f:
            tc = json.load(f)["text_config"]
        vocab = tc["vocab_size"]
        special = {tc.get(k) for k in ("image_token_id", "dspark_noise_token_id")}
        rng = random.Random(1000003 * (seed + args.prompt_seed) + 17)
        ids = []
        while len(ids) < args.tokens:
            t = rng.randrange(3, vocab)
            if t not in special:
                ids.append(t)
        tokens = ",".join(map(str, ids))
        stem = os.path.join(work, "s%d-p%d-aq%s" % (seed, args.prompt_seed, args.act_quant))
        outs = {"ref64": stem + "-ref64.f64", "ref32": stem + "-ref32.f32", "fast": stem + "-fast.f32"}
        base = [args.dsv41, "logits", "--model", model, "--tokens", tokens, "--act-quant", args.act_quant]
        run(base + ["--path", "reference", "--precision", "fp64", "--out", outs["ref64"]])
        run(base + ["--path", "reference", "--precision", "fp32", "--out", outs["ref32"]])
        info = run(base + ["--path", "fast", "--out", outs["fast"]])
        r64 = read_rows(outs["ref64"], vocab)
        r32 = read_rows(outs["ref32"], vocab)
        fst = read_rows(outs["fast"], vocab)
        d32 = [rel_l2(a, b) for a, b in zip(r32, r64)]
        dfa = [rel_l2(a, b) for a, b in zip(fst, r64)]
        dff = [rel_l2(a, b) for a, b in zip(fst, r32)]

        def first_far(d):
            return next((i for i, v in enumerate(d) if v > args.far), None)

        case = {"seed": seed, "tokens": tokens, "isa": info.get("isa"),
                "ref32_max": max(d32), "fast_max": max(dfa), "fast_vs_ref32_max": max(dff),
                "ref32_median": sorted(d32)[len(d32) // 2], "fast_median": sorted(dfa)[len(dfa) // 2],
                "ref32_first_far_row": first_far(d32), "fast_first_far_row": first_far(dfa)}
        cases.append(case)
        if args.json:
            print(json.dumps(case), flush=True)
        else:
            print("seed %3d  ref32 max %.2e (first far row %s)  fast max %.2e (first far row %s)"
                  % (seed, case["ref32_max"], case["ref32_first_far_row"], case["fast_max"],
                     case["fast_first_far_row"]), flush=True)

    n = len(cases)
    r32_far = sum(c["ref32_max"] > args.far for c in cases)
    f_far = sum(c["fast_max"] > args.far for c in cases)
    both = sum(c["ref32_max"] > args.far and c["fast_max"] > args.far for c in cases)
    # both far and equal to each other: the two fp32 runs rounded alike, fp64 the other way
    both_same = sum(c["ref32_max"] > args.far and c["fast_max"] > args.far and
                    c["fast_vs_ref32_max"] <= args.far for c in cases)
    quiet = [c for c in cases if c["ref32_max"] <= args.far and c["fast_max"] <= args.far]

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else float("nan")

    summary = {"act_quant": args.act_quant, "cases": n, "far": args.far,
               "ref32_far": r32_far, "fast_far": f_far, "both_far": both,
               "both_far_fast_equals_ref32": both_same,
               "quiet_cases_median_ref32_max": med([c["ref32_max"] for c in quiet]),
               "quiet_cases_median_fast_max": med([c["fast_max"] for c in quiet]),
               "median_ref32_max": med([c["ref32_max"] for c in cases]),
               "median_fast_max": med([c["fast_max"] for c in cases]),
               "isa": cases[0]["isa"] if cases else None, "work": work}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
