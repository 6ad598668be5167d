"""How long one arm stays on the unigram plateau, per setting: what sizes the stability map's proxy.

A learning-rate map is evidence only where runs get past the plateau at the codes' unigram
entropy and then flatten (Wortsman et al. 2023, arXiv 2309.14322, size their proxies the same way:
small models trained until the loss settles). This script trains one arm of a configuration once
per variant (a variant overrides dotted keys of the configuration) on already prepared and
tokenized data, and reports for each:

    exit step      first metrics row whose codebook-0 training loss is `--margin` bits (default
                   0.5) below the codes' codebook-0 unigram entropy (tokenizer.json)
    final          curves.final_loss of the codebook-0 training loss
    flattened      curves.flattened on that curve
    s/update       wall seconds per update (threads as given)

Variants run one after another in this process, `--jobs` at a time in worker processes, each
with `--threads` torch threads.

    python benchmarks/proxy_plateau.py --config config/config.yaml --steps 400 \
        --variant base: --variant cb1:model.codebooks=1 --variant "small:model.dim=64;model.heads=2"
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

from acoustic_mlm import config as C
from acoustic_mlm import curves


def parse_variant(text: str) -> tuple[str, dict]:
    """'name:key=value;key=value' -> (name, {dotted key: YAML value})."""
    name, _, body = text.partition(":")
    overrides = {}
    for item in filter(None, body.split(";")):
        key, _, value = item.partition("=")
        overrides[key.strip()] = yaml.safe_load(value)
    return name, overrides


def apply(settings: dict, overrides: dict) -> C.Config:
    """The configuration file's mapping (C.read_yaml) with `overrides` in place, validated and typed."""
    out = copy.deepcopy(settings)
    for dotted, value in overrides.items():
        node = out
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        if last not in node:
            raise SystemExit(f"no key {dotted!r} in the configuration")
        node[last] = value
    return C.from_mapping(out, source=f"variant {overrides}")


def one(cfg: C.Config, run: str, prepared: str, codes: str, threads: int, entropy: float, margin: float) -> dict:
    from acoustic_mlm.train import loop as train

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train.run(cfg, run, Path(prepared), Path(codes), Path(tmp) / run, threads=threads)
        wall = time.perf_counter() - t0
        m = pd.read_csv(Path(tmp) / run / "metrics.csv")
    loss = m["train_loss_cb0"].to_numpy()
    below = m["step"][loss < entropy - margin]
    final = curves.final_loss(m["step"], loss)
    return {
        "exit_step": int(below.iloc[0]) if len(below) else None,
        "final": round(final, 3),
        "valid_final": round(curves.final_loss(m["step"], m["valid_loss_cb0"]), 3),
        "flattened": curves.flattened(m["step"], loss),
        "max_grad_norm": round(float(m["grad_norm_max"].max()), 2),
        "s_per_update": round(wall / cfg.train.steps, 4),
        "curve": [round(x, 3) for x in loss.tolist()],
        "steps": m["step"].tolist(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--run", default="prenorm_clip1", help="the arm to train (default prenorm_clip1)")
    p.add_argument("--prepared", default="data/prepared")
    p.add_argument("--codes", default="data/codes")
    p.add_argument("--steps", type=int, default=400, help="updates per variant (train.steps)")
    p.add_argument("--variant", action="append", default=[], help="name:key=value;key=value (repeat; values are YAML)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="variants trained at once")
    p.add_argument("--margin", type=float, default=0.5, help="bits below the unigram entropy that end the plateau")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    a = p.parse_args(argv)
    base = C.read_yaml(a.config)  # the file's mapping: each variant edits it as a user edits the file
    typed = C.from_mapping(base, a.config)
    entropy = json.loads((Path(a.codes) / "tokenizer.json").read_text())["unigram_entropy_bits"][0]
    variants = [parse_variant(v) for v in (a.variant or ["base:"])]
    cfgs = {}
    for name, overrides in variants:
        overrides = {"train.steps": a.steps, **overrides}
        if "train.warmup_steps" not in overrides:
            overrides["train.warmup_steps"] = min(typed.train.warmup_steps, a.steps // 4)
        cfgs[name] = apply(base, overrides)
    print(f"codebook-0 unigram entropy {entropy:.3f} bits; plateau ends {a.margin} bits below it", flush=True)
    results = {}
    with cf.ProcessPoolExecutor(a.jobs) as pool:
        futures = {
            pool.submit(one, cfg, a.run, a.prepared, a.codes, a.threads, entropy, a.margin): name
            for name, cfg in cfgs.items()
        }
        for fut in cf.as_completed(futures):
            name = futures[fut]
            r = results[name] = fut.result()
            print(
                f"{name:>16}: exit step {r['exit_step']}, final {r['final']} (valid {r['valid_final']}), "
                f"flattened {r['flattened']}, max grad {r['max_grad_norm']}, {r['s_per_update']} s/update",
                flush=True,
            )
    if a.out:
        Path(a.out).write_text(json.dumps({"entropy": entropy, "args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
