"""Training-step throughput of the four arms against a `torch.nn.TransformerEncoder` baseline.

One step is one update of `acoustic_mlm.train.update`, built by its `build_trainer` and stepped by its
`update`, the code `amlm train` runs: the half model and fp32 master weights under fp16_fairseq,
autocast and the GradScaler under bf16 / fp16, compiled when the preset sets train.compile;
train.accum_steps micro-batches forward and backward, then clipping and AdamW. Every model trains
on the same fixed batch: random audio, random codes and one fairseq span mask, at the
configuration's width, depth, batch size and crop length; each precision builds the models afresh.

The baseline is the Pre-Norm arm with its transformer blocks swapped for
`nn.TransformerEncoder(nn.TransformerEncoderLayer(..., activation="gelu", batch_first=True,
norm_first=True))`: front end (conv features, feature LayerNorm and penalty, projection, mask
embedding, conv positional embedding), final LayerNorm and codebook heads are the package's
own, so the ratio isolates the blocks. The arms are timed in the same process, repetitions
interleaved (baseline, arm 1, ..., arm 4, baseline, arm 1, ...); each ratio is the median of
the per-repetition ratios arm_fps / baseline_fps, so slow drift in a shared machine cancels.

Model FLOPs are counted analytically (`acoustic_mlm.preflight.flops.step_flops`: matmuls and convolutions,
forward and backward, the same count for every arm whatever kernel runs it); MFU divides the achieved
rate by `--peak-tflops` (default on CUDA: the device's peak for the precision from preflight's table,
`acoustic_mlm.preflight.project.peak_tflops`, e.g. 989 dense bf16/fp16 and 67 fp32 on an H200; none on CPU).

Sized to fit one GPU: the micro-batch is one process's share of the preset's (train.batch_size /
(train.processes x train.nodes): MERT-330M's 7 crops, not the 448 of all 64 GPUs), and on CUDA the
models are built, timed and freed one at a time (`--sequential`, the default there), so only one model,
its optimizer state and its activations are on the device at once; on CPU they are interleaved.

    python benchmarks/train_throughput.py --config config/config.yaml --threads 1
    python benchmarks/train_throughput.py --config config/paper.yaml --device cuda --precision fp32,bf16
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from acoustic_mlm import config as C
from acoustic_mlm import encodec
from acoustic_mlm.devices import pick_device
from acoustic_mlm.model.encoder import init_bert_params
from acoustic_mlm.model.objective import AcousticMLM, MLMOutput, compute_mask_indices
from acoustic_mlm.preflight.flops import step_flops
from acoustic_mlm.preflight.project import _param_shapes as project_params
from acoustic_mlm.train.update import Trainer, build_trainer, update
from acoustic_mlm.utils import benchmark_header, machine_info, set_threads, write_result

BASELINE = "baseline"
H200_BF16_DENSE_TFLOPS = 989.0  # NVIDIA H200 (SXM) dense bf16 tensor-core peak
PRECISIONS = C.PRECISIONS  # every value train.precision takes
BENCH_SEED = 0  # weights, audio, codes and mask are identical on every run of the benchmark


# ----------------------------------------------------------------------------- models


def build_arm(cfg: C.Config, run: str) -> AcousticMLM:
    """One arm exactly as `acoustic_mlm.train.update.build_trainer` builds it."""
    torch.manual_seed(BENCH_SEED)
    return AcousticMLM(cfg.model_for(run))


def baseline_model_config(cfg: C.Config) -> C.ModelConfig:
    """The model without an arm: norm "pre", no DeepNorm, plain attention."""
    return cfg.model.with_arm("pre", "softmax")


def build_baseline(cfg: C.Config) -> AcousticMLM:
    """The Pre-Norm model with its blocks replaced by one `nn.TransformerEncoder` of the same size.

    `TransformerEncoder.forward` (the package's) still adds the conv positional embedding first
    and applies the final LayerNorm after the stack (Pre-Norm), so only the blocks differ.
    PyTorch's layer has a single dropout for attention probabilities and residuals: it takes
    `model.dropout` (every preset sets attention_dropout equal to it).
    """
    m = baseline_model_config(cfg)
    torch.manual_seed(BENCH_SEED)
    model = AcousticMLM(m)
    layer = nn.TransformerEncoderLayer(
        m.dim, m.heads, m.ffn_dim, m.dropout, activation="gelu", batch_first=True, norm_first=True
    )
    stack = nn.TransformerEncoder(layer, m.layers, enable_nested_tensor=False)  # deep-copies the layer
    stack.apply(init_bert_params)  # the arms' init (fused in_proj keeps PyTorch's xavier init)
    model.encoder.transformer.blocks = nn.ModuleList([stack])  # iterated once: x = stack(x)
    return model


# ----------------------------------------------------------------------------- one step


class TransformerOnly(nn.Module):
    """Scope "transformer": the encoder's transformer alone (positional conv, blocks, final norm) on
    states x (B, T, D), loss mean(y^2), returned as an MLMOutput so that `update` steps it; the
    other parameters get no gradient (AdamW skips them)."""

    def __init__(self, model: AcousticMLM):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> MLMOutput:
        loss = self.model.encoder.transformer(x).float().square().mean()
        z = loss.detach()
        return MLMOutput(loss, z.reshape(1), torch.zeros_like(z), torch.ones_like(z))


@dataclass
class Trainee:
    """One model as one arm of `acoustic_mlm.train.loop` trains it: a `train.update.Trainer`."""

    name: str  # run name, or "baseline"
    label: str  # legend label
    tr: Trainer
    lr: float
    accum_steps: int = 1  # micro-batches per update (the fixed batch is reused for each)
    last_loss: float = float("nan")

    @property
    def model(self) -> nn.Module:
        return self.tr.model

    def step(self, batch) -> torch.Tensor:
        """One update (`update`) of accum_steps micro-batches of `batch`: (wav, codes, mask) for
        the whole MLM, (x,) for scope "transformer". Returns the last micro-batch's detached loss."""
        return update(self.tr, [batch] * self.accum_steps, self.lr).outs[-1].loss.detach()


def trainee_builders(cfg: C.Config, device: torch.device, precision: str = "fp32", scope: str = "step") -> list:
    """[(name, build)]: the baseline first, then the arms in the configuration's order; build() makes the
    Trainee with `build_trainer` for `precision` (the transformer scope is never compiled).

    The baseline clips at 1; the clip value costs nothing: clip_grad_norm_ always computes the
    total norm and rescales every gradient by min(1, clip / norm).
    """
    t = dataclasses.replace(
        cfg.train_for(next(iter(cfg.runs))),
        precision=precision,
        clip=1.0,
        seed=BENCH_SEED,
        compile=cfg.train.compile and scope == "step",
    )
    wrap = TransformerOnly if scope == "transformer" else (lambda model: model)

    def baseline() -> Trainee:
        return Trainee(
            BASELINE,
            "nn.TransformerEncoder (Pre-Norm)",
            build_trainer(baseline_model_config(cfg), t, device, model=wrap(build_baseline(cfg))),
            t.lr,
            t.accum_steps,
        )

    def arm(run: str) -> Trainee:
        rc = cfg.run(run)
        tr = build_trainer(
            cfg.model_for(run), dataclasses.replace(t, clip=rc.clip), device, model=wrap(build_arm(cfg, run))
        )
        return Trainee(run, rc.label, tr, t.lr, t.accum_steps)

    return [(BASELINE, baseline)] + [(run, lambda run=run: arm(run)) for run in cfg.runs]


def trainees(cfg: C.Config, device: torch.device, precision: str = "fp32", scope: str = "step") -> list[Trainee]:
    """Every model of `trainee_builders`, built at once (interleaved timing)."""
    return [build() for _, build in trainee_builders(cfg, device, precision, scope)]


def fixed_batch(cfg: C.Config, device: torch.device, scope: str = "step"):
    """Random audio (B, 320 T), random codes (B, K, T) and one fairseq span mask (B, T);
    scope "transformer": random states (B, T, D) only."""
    m, t = cfg.model, cfg.train  # the sections: the batch is the same for every arm
    frames = cfg.crop_frames
    g = torch.Generator().manual_seed(BENCH_SEED)
    if scope == "transformer":
        return (torch.randn(t.batch_size, frames, m.dim, generator=g).to(device),)
    wav = 0.1 * torch.randn(t.batch_size, frames * encodec.HOP, generator=g)
    codes = torch.randint(m.codebook_size, (t.batch_size, m.codebooks, frames), generator=g)
    mask = compute_mask_indices(
        (t.batch_size, frames), m.mask_prob, m.mask_length, m.mask_min_masks, np.random.default_rng(BENCH_SEED)
    )
    return wav.to(device), codes.to(device), torch.from_numpy(mask).to(device)


# ----------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(tr: Trainee, batch, device, steps: int) -> float:
    """Milliseconds per step over `steps` consecutive steps."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = tr.step(batch)
    _sync(device)
    elapsed = time.perf_counter() - t0
    tr.last_loss = float(loss)
    return 1000.0 * elapsed / steps


def benchmark(models: list[Trainee], batch, device, precision: str, steps: int, warmup: int, repeats: int) -> dict:
    """{name: [ms/step per repetition]}, repetitions interleaved across models."""
    for tr in models:
        for _ in range(warmup):
            tr.step(batch)
        tr.tr.opt.zero_grad(set_to_none=True)
    times: dict[str, list[float]] = {tr.name: [] for tr in models}
    for r in range(repeats):
        for tr in models:
            times[tr.name].append(time_steps(tr, batch, device, steps))
            tr.tr.opt.zero_grad(set_to_none=True)  # free gradients before the next model runs
        print(
            f"  {precision} repeat {r + 1}/{repeats}: "
            + " ".join(f"{name}={ms[-1]:.1f}ms" for name, ms in times.items()),
            file=sys.stderr,
            flush=True,
        )
    return times


def benchmark_sequential(builders, batch, device, precision: str, steps: int, warmup: int, repeats: int):
    """({name: [ms/step per repetition]}, [the models' records]): each model built, warmed up, timed
    `repeats` times and freed before the next is built, so one model's memory is on the device at a time."""
    import gc

    times: dict[str, list[float]] = {}
    done: list[Trainee] = []
    for name, build in builders:
        tr = build()
        for _ in range(warmup):
            tr.step(batch)
        times[name] = [time_steps(tr, batch, device, steps) for _ in range(repeats)]
        print(f"  {precision} {name}: " + " ".join(f"{ms:.1f}ms" for ms in times[name]), file=sys.stderr, flush=True)
        done.append(Trainee(tr.name, tr.label, None, tr.lr, tr.accum_steps, tr.last_loss))  # without its model
        del tr
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return times, done


def _quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def summarize(models, times: dict, precision: str, frames_per_step: int, flops: int, peak_tflops) -> list[dict]:
    base = times[BASELINE]
    rows = []
    for tr in models:
        ms = times[tr.name]
        ratios = [b / a for a, b in zip(ms, base)]  # arm_fps / baseline_fps, paired per repetition
        med = statistics.median(ms)
        tflops = flops / (med / 1000.0) / 1e12
        rows.append(
            {
                "model": tr.name,
                "label": tr.label,
                "precision": precision,
                "ms_per_step": med,
                "frames_per_s": frames_per_step / (med / 1000.0),
                "ratio_to_baseline": statistics.median(ratios),
                "ratio_q25": _quantile(ratios, 0.25),
                "ratio_q75": _quantile(ratios, 0.75),
                "ms_per_step_all": ms,
                "model_flops_per_step": flops,
                "tflops": tflops,
                "mfu": tflops / peak_tflops if peak_tflops else None,
                "final_loss": tr.last_loss,
            }
        )
    return rows


def relax_twins(cfg: C.Config) -> dict[str, str]:
    """{attn-relax arm: the arm identical to it but for plain (fused) attention}, where one exists."""
    runs = cfg.runs
    twins = {}
    for name, r in runs.items():
        if r.attention == "pb_relax":
            same = [o for o, x in runs.items() if x.attention == "softmax" and x.norm == r.norm]
            same.sort(key=lambda o: runs[o].clip != r.clip)  # same clip first (it costs nothing anyway)
            if same:
                twins[name] = same[0]
    return twins


def add_relax_cost(rows: list[dict], times: dict, twins: dict[str, str]) -> None:
    """Per relax arm: fps relative to its plain twin (median of paired per-repetition ratios)."""
    for row in rows:
        twin = twins.get(row["model"])
        if twin is not None:
            ratios = [b / a for a, b in zip(times[row["model"]], times[twin])]
            row.update(twin=twin, ratio_to_twin=statistics.median(ratios))


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| model | precision | ms/step | frames/s | ratio to baseline | ratio IQR | TFLOP/s | MFU |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['ms_per_step']:.1f} | {r['frames_per_s']:.0f} | "
            f"{r['ratio_to_baseline']:.3f} | {r['ratio_q25']:.3f}-{r['ratio_q75']:.3f} | "
            f"{r['tflops']:.3g} | {mfu} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="config/config.yaml", help="preset to measure (default: %(default)s)")
    p.add_argument("--device", default="auto", help="cpu | cuda | auto (default: %(default)s)")
    p.add_argument(
        "--precision",
        default=None,
        help=f"comma-separated list of {', '.join(PRECISIONS)} (default: fp32 on CPU, fp32,bf16 on CUDA)",
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps per model per repetition (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the config's train.threads)")
    p.add_argument(
        "--scope",
        choices=("step", "transformer"),
        default="step",
        help="step: the whole MLM training step; transformer: positional conv + blocks + final norm "
        "only, to resolve differences the front end and heads dilute (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="crops per micro-batch (default: one process's share, train.batch_size / processes)",
    )
    p.add_argument("--accum-steps", type=int, default=None, help="micro-batches per step (default: train.accum_steps)")
    p.add_argument(
        "--sequential",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build, time and free one model at a time (default: on CUDA; interleaved on CPU)",
    )
    p.add_argument("--crop-seconds", type=float, default=None, help="override train.crop_seconds")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="peak for MFU; default on CUDA the device's for each precision (preflight's table), none on CPU",
    )
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results here")
    args = p.parse_args(argv)
    for name in ("steps", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    for prec in (args.precision or "").split(","):
        if prec and prec not in PRECISIONS:
            p.error(f"--precision: unknown '{prec}' (choose from {', '.join(PRECISIONS)})")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    preset = C.load(args.config)
    settings = C.read_yaml(args.config)  # the file's mapping: the overrides edit it as a user edits the file
    # one process's share of the global micro-batch, on one device
    settings["train"].update(
        batch_size=args.batch_size or preset.train.batch_size // preset.train.world, processes=1, nodes=1
    )
    for key in ("crop_seconds", "accum_steps"):
        if getattr(args, key) is not None:
            settings["train"][key] = getattr(args, key)
    cfg = C.from_mapping(settings, source=f"{args.config} with overrides")
    set_threads(args.threads if args.threads is not None else cfg.train.threads)
    device = pick_device(args.device)
    precisions = (args.precision or ("fp32,bf16" if device.type == "cuda" else "fp32")).split(",")
    sequential = device.type == "cuda" if args.sequential is None else args.sequential

    def peak_for(prec: str):
        if args.peak_tflops is not None or device.type != "cuda":
            return args.peak_tflops
        from acoustic_mlm.preflight.project import peak_tflops

        return peak_tflops(torch.cuda.get_device_name(device), prec)

    m, t = baseline_model_config(cfg), cfg.train
    frames = cfg.crop_frames
    n_masked = int(fixed_batch(cfg, torch.device("cpu"))[2].sum())
    batch = fixed_batch(cfg, device, args.scope)
    frames_per_step = t.accum_steps * t.batch_size * frames
    flops = t.accum_steps * step_flops(m, t.batch_size, frames, args.scope)
    params = sum(p.numel() for p in project_params(cfg.model_for(next(iter(cfg.runs)))))
    info = machine_info(device)
    print(
        f"# {args.config}, scope {args.scope}: {t.accum_steps} x batch {t.batch_size} x {frames} frames = "
        f"{frames_per_step} frames/step{' (compiled)' if t.compile else ''} "
        f"({n_masked} masked); width {m.dim}, {m.layers} layers, {m.heads} heads; "
        f"{params:,} params; {flops / 1e9:.3g} model GFLOP/step",
        file=sys.stderr,
    )
    print(f"# {info}", file=sys.stderr, flush=True)

    rows = []
    for prec in precisions:
        if sequential:
            times, models = benchmark_sequential(
                trainee_builders(cfg, device, prec, args.scope),
                batch,
                device,
                prec,
                args.steps,
                args.warmup,
                args.repeats,
            )
        else:
            models = trainees(cfg, device, prec, args.scope)
            times = benchmark(models, batch, device, prec, args.steps, args.warmup, args.repeats)
        prec_rows = summarize(models, times, prec, frames_per_step, flops, peak_for(prec))
        models = None  # this precision's models freed before the next are built
        add_relax_cost(prec_rows, times, relax_twins(cfg))
        rows += prec_rows
    print(markdown_table(rows))
    relax_lines = [
        f"{r['model']} ({r['precision']}): {r['ratio_to_twin']:.3f} x the frames/s of {r['twin']} "
        "(PB-Relax attention against the fused kernel)"
        for r in rows
        if "ratio_to_twin" in r
    ]
    if relax_lines:
        print("\n" + "\n".join(relax_lines))
    nonfinite = [r["model"] for r in rows if not np.isfinite(r["final_loss"])]
    if nonfinite:
        print(f"warning: non-finite loss after timing in {', '.join(nonfinite)}", file=sys.stderr)

    result = {
        **benchmark_header(__file__, argv),
        "config": str(args.config),
        "scope": args.scope,
        "machine": info,
        "batch_size": t.batch_size,
        "accum_steps": t.accum_steps,
        "compile": t.compile,
        "crop_frames": frames,
        "frames_per_step": frames_per_step,
        "masked_frames": n_masked,
        "steps": args.steps,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "peak_tflops": {prec: peak_for(prec) for prec in precisions},
        "sequential": sequential,
        "rows": rows,
    }
    return write_result(args.json, result)


if __name__ == "__main__":
    main()
