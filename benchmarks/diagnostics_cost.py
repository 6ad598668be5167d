"""CPU cost of the stability diagnostics (train.diagnostics), as a ratio to training without them.

Two measurements in one invocation, at the configuration's model and batch size:

1. Whole runs: `acoustic_mlm.train.loop.run` of one arm for --steps steps on a generated corpus
   (acoustic_mlm.experiments.tone_corpus.write_corpus: the package's prepared/codes layout, no EnCodec),
   with `train.diagnostics` true and false, alternating (off, on, off, on, ...). Timed as this
   process's CPU time (one thread: what other processes on a shared machine do not change) and
   as wall time; the ratio is the median over repetitions of on / off. Rows come at steps 1, 2,
   4, ... and every log_interval steps, as in the pipeline, so a short run has more rows per step
   than the preset's: the CPU time the diagnostics add per row, (on - off) / rows, is also
   projected onto a whole run of the preset (its train.steps and its rows).
2. Each diagnostic alone: its time per metrics row (median of --reps timings), divided by
   log_interval training steps (the median time of one full update: forward, backward, clip,
   AdamW), i.e. its share of training time when logged every log_interval steps.

    python benchmarks/diagnostics_cost.py --config config/config.yaml --steps 400 --reps 3 --threads 1
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.experiments.tone_corpus import write_corpus
from acoustic_mlm.model.objective import compute_mask_indices
from acoustic_mlm.train import diagnostics as D
from acoustic_mlm.train import loop
from acoustic_mlm.train import update as U
from acoustic_mlm.train.precision import make_precision
from acoustic_mlm.train.schedule import log_steps
from acoustic_mlm.utils import machine_info, set_threads, write_result

HERE = Path(__file__).resolve().parent
RUN = "prenorm_clip1"


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def whole_runs(settings: dict, steps: int, reps: int, threads: int, work: Path, source: str = "config") -> dict:
    """`settings`: the configuration file's mapping (C.read_yaml), edited per run as a user edits the file."""
    cfg = C.from_mapping(settings, source)
    prepared, codes = write_corpus(work / "data", clips=16, frames=max(300, 2 * cfg.crop_frames))
    walls, cpus = {True: [], False: []}, {True: [], False: []}
    for rep in range(reps):
        for on in (False, True):
            edited = copy.deepcopy(settings)
            edited["train"].update(
                steps=steps, diagnostics=on, checkpoint_interval=0, warmup_steps=min(cfg.train.warmup_steps, steps - 1)
            )
            c = C.from_mapping(edited, f"{source} with {steps} steps, diagnostics {on}")
            out = work / f"run-{rep}-{int(on)}"
            t0, w0 = time.process_time(), time.perf_counter()
            loop.run(c, RUN, prepared, codes, out, threads=threads)
            cpus[on].append(time.process_time() - t0)
            walls[on].append(time.perf_counter() - w0)
            shutil.rmtree(out)
    interval, total = cfg.train.log_interval, cfg.train.steps
    rows, preset_rows = len(log_steps(steps, interval)), len(log_steps(total, interval))
    per_row = statistics.median([(a - b) / rows for a, b in zip(cpus[True], cpus[False])])
    per_step = statistics.median(cpus[False]) / steps
    return {
        "steps": steps,
        "rows": rows,
        "cpu_on_s": cpus[True],
        "cpu_off_s": cpus[False],
        "wall_on_s": walls[True],
        "wall_off_s": walls[False],
        "cpu_ratio": statistics.median([a / b for a, b in zip(cpus[True], cpus[False])]),
        "wall_ratio": statistics.median([a / b for a, b in zip(walls[True], walls[False])]),
        "added_cpu_per_row_s": per_row,
        "preset_steps": total,
        "preset_rows": preset_rows,
        "preset_ratio": 1 + per_row * preset_rows / (per_step * total),
    }


def per_diagnostic(cfg: C.Config, reps: int) -> dict:
    """Each diagnostic's time per row against log_interval training steps, on one model and batch."""
    m, t = cfg.model_for(RUN), cfg.train_for(RUN)
    tr = U.build_trainer(m, dataclasses.replace(t, seed=0), torch.device("cpu"))  # what amlm train steps
    model, opt = tr.model, tr.opt
    T = cfg.crop_frames
    rng = np.random.default_rng(0)

    def batch(n):
        wav = torch.randn(n, T * encodec.HOP)
        codes = torch.randint(0, m.codebook_size, (n, m.codebooks, T))
        mask = torch.from_numpy(compute_mask_indices((n, T), m.mask_prob, m.mask_length, m.mask_min_masks, rng))
        return wav, codes, mask

    wav, codes, mask = batch(t.batch_size)

    def step():
        U.update(tr, [(wav, codes, mask)], t.lr)

    for _ in range(3):
        step()  # warm-up
    t_step = _median_time(step, max(reps, 10))
    opt.zero_grad(set_to_none=True)
    model(wav, codes, mask).loss.backward()  # gradients in place for the update diagnostics
    blocks = D.param_blocks(model)

    def update_ratio():
        before = D.snapshot(blocks)
        D.update_ratios(blocks, before)

    vwav, vcodes, vmask = batch(t.valid_crops)  # the validation pass's size
    inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda mod, args: inputs.append((mod, args[0])))
        for b in model.encoder.transformer.blocks
    ]
    with torch.no_grad():
        h, _ = model.encoder(vwav, vmask)
        logits = model.heads(h[vmask], m.logit_temp)
    for hk in hooks:
        hk.remove()
    targets = vcodes.transpose(1, 2)[vmask]

    def attention():
        with torch.no_grad():
            for mod, x in inputs:
                float(D.attention_logits(x, mod.q_proj, mod.k_proj, mod.heads).abs().amax())

    def accuracy():
        float(D.codebook_correct(logits, targets))

    fp32 = make_precision("fp32", torch.device("cpu"))

    def evaluate(probe: bool):
        def run():
            if probe:
                with D.ValidProbe(model) as p:
                    U.evaluate(model, vwav, vcodes, vmask, fp32)
                p.values()
            else:
                U.evaluate(model, vwav, vcodes, vmask, fp32)

        return run

    per_row = {
        "grad_norm per block": _median_time(lambda: D.grad_norms(blocks), reps),
        "update_ratio per block (weight copy + norms)": _median_time(update_ratio, reps),
        "attention logit max per layer": _median_time(attention, reps),
        "codebook-0 accuracy": _median_time(accuracy, reps),
        "masked fraction, loss scale": _median_time(lambda: D.masked_fraction(int(mask.sum()), mask.numel()), reps),
    }
    plain, hooked = _median_time(evaluate(False), reps), _median_time(evaluate(True), reps)
    per_row["validation pass with ValidProbe hooks (attention + accuracy), minus without"] = hooked - plain
    interval = cfg.train.log_interval
    return {
        "step_s": t_step,
        "log_interval": interval,
        "validation_pass_s": plain,
        "per_row_s": per_row,
        "share_of_training": {k: v / (interval * t_step) for k, v in per_row.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--steps", type=int, default=400, help="steps per whole run")
    p.add_argument("--reps", type=int, default=3, help="whole-run pairs; per-diagnostic timings use 10x")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    settings = C.read_yaml(args.config)
    cfg = C.from_mapping(settings, args.config)
    set_threads(args.threads)
    result = {"config": args.config, "machine": machine_info(torch.device("cpu")), "threads": args.threads}
    result["per_diagnostic"] = per_diagnostic(cfg, 10 * args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        result["whole_run"] = whole_runs(settings, args.steps, args.reps, args.threads, Path(tmp), args.config)
    pd_ = result["per_diagnostic"]
    print(
        f"one training step: {1000 * pd_['step_s']:.1f} ms; a row every {pd_['log_interval']} steps; "
        f"validation pass {1000 * pd_['validation_pass_s']:.1f} ms"
    )
    print("| diagnostic | time per row (ms) | share of training time |")
    print("| --- | --- | --- |")
    for k, v in pd_["per_row_s"].items():
        print(f"| {k} | {1000 * v:.2f} | {100 * pd_['share_of_training'][k]:.3f} % |")
    w = result["whole_run"]
    print(
        f"whole run, {w['steps']} steps, {w['rows']} rows: diagnostics on / off = {w['cpu_ratio']:.4f} in CPU time, "
        f"{w['wall_ratio']:.4f} in wall time; CPU s on {', '.join(f'{x:.1f}' for x in w['cpu_on_s'])}, "
        f"off {', '.join(f'{x:.1f}' for x in w['cpu_off_s'])}"
    )
    print(
        f"added CPU time per row {1000 * w['added_cpu_per_row_s']:.1f} ms; projected onto the preset's "
        f"{w['preset_steps']} steps and {w['preset_rows']} rows: on / off = {w['preset_ratio']:.4f}"
    )
    write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
