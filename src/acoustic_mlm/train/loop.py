"""The train stage: one arm of the ablation, metrics to a plain CSV, a final checkpoint.

This module runs the arm, seed by seed, in named steps; the update is `update.py`'s, the crops
`crops.py`'s, the schedules `schedule.py`'s, the resumable states `state.py`'s and the rows' means
and the summaries `summary.py`'s.

Every arm with the same seed sees the same initial weights (where the architecture allows),
the same crops and the same masks: arms then differ only in their stability settings.
The validation set (crops and masks) is fixed and shared by all arms.

Metrics rows (`metrics.csv`) are written every `log_interval` steps, at the last step, and (unless
`train.log_powers_of_two` is false) at steps 1, 2, 4, 8, ...; their columns, files, writers and
readers are acoustic_mlm.artifacts.metrics's, the summaries' keys acoustic_mlm.artifacts.run_summary's.
Under a precision that retries overflows (fairseq's, precision.py) a step is an update: steps whose
gradients overflowed are not counted.
With train.diagnostics, each row also holds the stability diagnostics of `diagnostics.py`
(per-block gradient norms and update ratios, attention logit maxima, masked share, codebook-0
accuracy), measured at the row steps only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch
import torch.distributed as dist

from acoustic_mlm import config as C
from acoustic_mlm.artifacts import metrics as M
from acoustic_mlm.artifacts.checkpoint import write_checkpoint
from acoustic_mlm.artifacts.metrics import METRICS, join_seed_metrics, remove_partial, write_metrics, write_partial
from acoustic_mlm.artifacts.prepared import load_prepared
from acoustic_mlm.artifacts.run_summary import SUMMARY, write_summary
from acoustic_mlm.devices import pick_device
from acoustic_mlm.errors import UserError
from acoustic_mlm.folder_lock import folder_lock
from acoustic_mlm.train import diagnostics
from acoustic_mlm.train.crops import CropData, batches, check_codes
from acoustic_mlm.train.distributed import init_distributed
from acoustic_mlm.train.precision import MinLossScaleError, Precision
from acoustic_mlm.train.schedule import log_steps, lr_at
from acoustic_mlm.train.state import (
    STATE_DIR,
    STATE_KEYS,
    completed_summary,
    fingerprint,
    load_latest_state,
    rng_state,
    save_state,
    set_rng_state,
)
from acoustic_mlm.train.summary import Accumulator, summarize, summarize_arm
from acoustic_mlm.train.trackers import Trackers, check_available
from acoustic_mlm.train.update import Trainer, build_trainer, evaluate, update
from acoustic_mlm.utils import Progress, log, set_threads

VALID_SEED = 20230601  # fixed: every arm is scored on the same crops and masks


@dataclass(frozen=True)
class SeedJob:
    """One seed of one arm as this process trains it: the settings, the folders it reads and writes,
    and the process's place among the DDP processes."""

    cfg: C.Config  # the run's configuration (a sweep point's own)
    run_name: str
    seed: int
    prepared_dir: Path  # the prepare stage's output
    codes_dir: Path  # the tokenize stage's output
    out_dir: Path  # <run>/seeds/seed<S>/: the seed's metrics.csv, checkpoint.pt and summary.json
    state_dir: Path  # <run>/state/seed<S>/: its resumable states
    rank: int = 0
    world: int = 1  # DDP processes

    @property
    def writer(self) -> bool:  # with several processes only the first writes files
        return self.rank == 0


def run(
    cfg: C.Config, run_name: str, prepared_dir: Path, codes_dir: Path, out_dir: Path, threads: int | None = None
) -> dict:
    """Train one arm, once per seed; write the arm's metrics.csv (a `seed` column) and summary.json.

    Each seed's own metrics, summary and final checkpoint land in out_dir/seeds/seed<S>/, its
    resumable state in out_dir/state/seed<S>/. A seed already completed with the same settings
    is not trained again.
    """
    cfg = cfg.point(run_name)  # a sweep point's own settings, resolved here only; an unknown run is refused
    rc = cfg.run(run_name)
    out_dir = Path(out_dir)
    check_available(cfg.train.loggers)  # in every process, before any work
    rank, world = init_distributed(cfg.train.device)
    planned = cfg.train.world
    if world != planned and rank == 0:  # the same global batch either way; only memory and speed differ
        log.warning(
            "train %s: %d processes, where train.nodes x train.processes is %d (launch it with the "
            "workflow or torchrun); the global batch is the same",
            run_name,
            world,
            planned,
        )
    if cfg.train.batch_size % world:
        raise UserError(f"'train.batch_size' ({cfg.train.batch_size}) must be divisible by the {world} processes")
    jobs = [
        SeedJob(
            cfg=cfg,
            run_name=run_name,
            seed=seed,
            prepared_dir=Path(prepared_dir),
            codes_dir=Path(codes_dir),
            out_dir=out_dir / "seeds" / f"seed{seed}",
            state_dir=out_dir / STATE_DIR / f"seed{seed}",
            rank=rank,
            world=world,
        )
        for seed in rc.seeds
    ]
    # one writer per run folder: a second train of it (other settings, another shell) is refused while this runs
    with folder_lock(out_dir, f"train {run_name}") if rank == 0 else contextlib.nullcontext():
        summaries = [train_seed(job, threads) for job in jobs]
        if rank != 0:  # only the first process writes
            return summaries[0]
        shutil.rmtree(out_dir / STATE_DIR, ignore_errors=True)  # every seed is complete: nothing to resume
        metrics = join_seed_metrics({job.seed: job.out_dir / METRICS for job in jobs})
        summary = summarize_arm(rc, summaries)
        write_summary(out_dir / SUMMARY, summary)
        write_metrics(out_dir / METRICS, metrics)
        return summary


# ----------------------------------------------------------------------------- one seed, in named steps
#
#   train_seed = build -> restore -> (train_step -> record -> checkpoint)* -> finish


@dataclass
class Setup:
    """What stays fixed during one seed's run: the job, settings, model, optimizer, data."""

    job: SeedJob  # which seed of which arm, its folders, this process's rank
    rc: C.RunConfig
    m: C.ModelConfig
    t: C.TrainConfig
    device: torch.device
    fingerprint: dict
    tr: Trainer  # model, optimizer, precision (its loss scaler): what `update` steps
    train_data: CropData
    valid: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # fixed held-out (wav, codes, mask)
    rows_at: set[int]  # steps that get a metrics row

    @property
    def writer(self) -> bool:  # with several processes only the first writes files
        return self.job.writer

    @property
    def model(self) -> torch.nn.Module:  # the parameters (saved, evaluated)
        return self.tr.model

    @property
    def opt(self) -> torch.optim.Optimizer:
        return self.tr.opt

    @property
    def precision(self) -> Precision:  # autocast, loss scaler, master weights (precision.py)
        return self.tr.precision


@dataclass
class Loop:
    """What changes as the seed trains; all of it is in the resumable state."""

    acc: Accumulator
    step: int = 0  # the last completed step (retried overflows, precision.py, are not counted)
    batches: int = 0  # micro-batches drawn so far (each step draws accum_steps, counted or not)
    rows: list = field(default_factory=list)
    nonfinite: int = 0  # updates skipped for a non-finite loss
    streak: int = 0  # ... in a row
    overflow: int = 0  # updates skipped by the loss scaler
    clipped: int = 0  # updates whose gradient norm was clipped
    elapsed: float = 0.0  # seconds of training before this process started
    diverged_at: int | None = None
    stop_reason: str | None = None  # why the seed stopped early: nonfinite | min_loss_scale

    # the counters a resumable state holds, restored as they were saved (diverged_at and stop_reason
    # end a seed, so a state never carries them)
    SAVED = ("step", "batches", "rows", "nonfinite", "streak", "overflow", "clipped", "elapsed")

    def state(self) -> dict:
        return {**{k: getattr(self, k) for k in self.SAVED}, "accumulator": self.acc.state()}

    def load(self, state: dict, accum_steps: int) -> None:
        """The counters of a saved state; one saved before `batches` was kept drew accum_steps per step."""
        for k in self.SAVED:
            setattr(self, k, state.get(k, self.step * accum_steps) if k == "batches" else state[k])
        self.rows = list(self.rows)


class StepResult(NamedTuple):
    lr: float
    grad_norm: float  # total norm before clipping (NaN when the update was skipped)
    clipped: bool
    counted: bool = True  # a step of train.steps (False for an overflow the precision retries, as fairseq)
    diagnostics: dict | None = None  # at row steps with train.diagnostics: diagnostics.UpdateProbe's row


def train_seed(job: SeedJob, threads: int | None = None) -> dict:
    """Train one arm with one seed; write metrics.csv, checkpoint.pt and summary.json into job.out_dir."""
    cfg = job.cfg
    set_threads(threads if threads is not None else cfg.train.threads)
    done = completed_summary(job.out_dir, fingerprint(cfg, job.run_name, job.world))
    if done is not None:
        log.info("train %s seed %d: already complete in %s", job.run_name, job.seed, job.out_dir)
        return done
    s = build(job)
    loop = restore(s)
    t = s.t
    t0 = time.monotonic() - loop.elapsed
    # retried overflows draw micro-batches without counting, so the loader is open-ended
    last = 2**62 if s.precision.retries_overflows else t.steps * t.accum_steps
    loader = iter(batches(s.train_data, loop.batches, last, t.workers, pin=s.device.type == "cuda"))
    with (
        Progress(
            t.steps, f"train {job.run_name}", unit="step", stream=None if s.writer else open(os.devnull, "w")
        ) as bar,
        Trackers(cfg, job.run_name, job.seed, job.out_dir, enabled=s.writer) as trackers,
    ):  # train.loggers beside the CSV
        bar.update(loop.step)
        while loop.step < t.steps:
            result = train_step(s, loop, loader, loop.step + 1)
            step = loop.diverged_at or loop.step
            bar.update(int(result.counted))
            if (result.counted and step in s.rows_at) or loop.diverged_at:
                row = record(s, loop, step, result, time.monotonic() - t0)
                if row is not None:
                    trackers.log(row)  # at metrics rows only (trackers.py)
                    bar.update(0, cb0=row[M.FIGURE_LOSS])  # shown between rows: no per-step host copy
            if loop.diverged_at:
                break
            if (
                result.counted
                and t.checkpoint_interval
                and step % t.checkpoint_interval == 0
                and step < t.steps
                and s.writer
            ):
                loop.elapsed = time.monotonic() - t0
                checkpoint(s, loop, step)
    return finish(s, loop)


def build(job: SeedJob) -> Setup:
    """Settings, data (training crops and the fixed validation set), model, optimizer and scaler."""
    cfg, run_name = job.cfg, job.run_name
    rc, m, t = cfg.run(run_name), cfg.model_for(run_name), cfg.train_for(run_name, job.seed)
    device = pick_device(t.device)
    corpus = load_prepared(job.prepared_dir, cfg.data.sample_format)  # a corpus of another format: refused
    check_codes(job.codes_dir, corpus, m)
    crop_frames = cfg.crop_frames
    train_data = CropData(
        corpus,
        job.codes_dir,
        "train",
        crop_frames,
        t.batch_size,
        m,
        t.seed,
        job.rank,
        job.world,
        t.crop_unit,
        t.mask_group,
        mixture=True,
    )
    # The validation set is fixed (crops and masks) and shared by every arm.
    valid = CropData(corpus, job.codes_dir, "valid", crop_frames, t.valid_crops, m, VALID_SEED)[0]

    tr = build_trainer(m, t, device, job.rank, job.world)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    log.info(
        "train %s: %s, %d params, %d steps of %d x %d x %d frames on %s (%s)",
        run_name,
        rc.label,
        sum(p.numel() for p in tr.model.parameters()),
        t.steps,
        t.accum_steps,
        t.batch_size,
        crop_frames,
        device,
        t.precision,
    )
    rows_at = set(log_steps(t.steps, t.log_interval, t.log_powers_of_two))
    return Setup(
        job=job,
        rc=rc,
        m=m,
        t=t,
        device=device,
        fingerprint=fingerprint(cfg, run_name, job.world),
        tr=tr,
        train_data=train_data,
        valid=valid,
        rows_at=rows_at,
    )


def restore(s: Setup) -> Loop:
    """A fresh loop, or the newest resumable state of this seed (model, optimizer, precision, RNG, rows)."""
    loop = Loop(acc=Accumulator(s.m.codebooks))
    state = (
        load_latest_state(s.job.state_dir, s.fingerprint, STATE_KEYS, _resumable_by(s))
        if s.t.checkpoint_interval
        else None
    )
    if state is None:
        return loop
    s.model.load_state_dict(state["model"])
    s.opt.load_state_dict(state["optimizer"])
    s.precision.load_state_dict(state)  # the entries its state_dict gave
    set_rng_state(state["rng"], s.device)
    loop.acc.load(state["accumulator"], s.device)
    loop.load(state, s.t.accum_steps)
    log.info("train %s seed %d: resuming after step %d from %s", s.job.run_name, s.job.seed, loop.step, s.job.state_dir)
    return loop


def _resumable_by(s: Setup):
    """load_latest_state's check of a state's content against this seed's setup: its model tensors are
    this model's (names and shapes), its optimizer has this optimizer's groups, its accumulator, RNG
    state and the precision's part are whole, its step lies within train.steps. A reason for the first
    mismatch, or None."""
    own = s.model.state_dict()

    def check(state: dict) -> str | None:
        model = state["model"]
        if set(model) != set(own):
            name = min(set(model) ^ set(own))
            return f"holds another model (parameter {name!r} {'missing' if name in own else 'unknown'})"
        for name, value in model.items():
            if not isinstance(value, torch.Tensor) or value.shape != own[name].shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                return f"holds 'model.{name}' of {shape}, this model's is {tuple(own[name].shape)}"
        groups = state["optimizer"].get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(s.opt.param_groups) or "state" not in state["optimizer"]:
            return "holds another optimizer's state"
        acc = state["accumulator"]
        if any(k not in acc for k in ("n", "sums", "clipped", "gmax")):
            return "lacks part of 'accumulator'"
        if not isinstance(state["rng"].get("cpu"), torch.Tensor):
            return "lacks 'rng.cpu'"
        problem = s.precision.state_problem(state)
        if problem:
            return problem
        if not 0 < state["step"] <= s.t.steps:
            return f"is at step {state['step']}, outside 1-{s.t.steps}"
        return None

    return check


def train_step(s: Setup, loop: Loop, loader, step: int) -> StepResult:
    """One update (`update`): the schedule's lr, accum_steps micro-batches from the loader, clip, step.

    A non-finite loss on any micro-batch (in any process) skips the update, whose micro-batches are
    drawn all the same (micro-batch n is the same after a skip as after a resume); train.max_nonfinite
    of them in a row end the seed as diverged. Under a precision that retries overflows (fairseq's,
    as fairseq/trainer.py; precision.py): an overflow (a non-finite loss, whose gradients would
    overflow, included) is not an update: the step counter, the schedule and the metrics' means skip
    it, the loss scale halves, and when it would reach min_loss_scale the seed stops as diverged
    (stop_reason min_loss_scale); train.max_nonfinite does not apply.

    With train.diagnostics, at a metrics row: the per-block gradient norms as the update sees them
    (before clipping) and the update ratios of the weights the optimizer steps (precision.py's
    `named_weights`), and the masked share.
    """
    t = s.t
    lr = lr_at(step, t)
    at_row = bool(t.diagnostics and step in s.rows_at and s.writer)
    micro = []
    for _ in range(t.accum_steps):
        micro.append([x.to(s.device, non_blocking=True) for x in next(loader)])  # wav, codes, mask[, clean wav]
        loop.batches += 1
    nan = float("nan")
    try:
        u = update(s.tr, micro, lr, probe=at_row)
    except MinLossScaleError as exc:
        loop.overflow += 1
        loop.diverged_at, loop.stop_reason = step, "min_loss_scale"
        log.warning("train %s seed %d: %s (update %d); stopped as diverged", s.job.run_name, s.job.seed, exc, step)
        return StepResult(lr, nan, False, counted=False)
    if u.overflow and s.precision.retries_overflows:  # not an update: drawn again
        loop.overflow += 1
        return StepResult(lr, u.grad_norm, False, counted=False)
    loop.step = step
    if not u.finite:
        loop.nonfinite += 1  # skipped: no update from a non-finite loss
        loop.streak += 1
        if t.max_nonfinite and loop.streak >= t.max_nonfinite:
            loop.diverged_at, loop.stop_reason = step, "nonfinite"  # divergence is a result: record it, stop
            log.warning(
                "train %s seed %d: diverged, %d non-finite steps in a row at step %d",
                s.job.run_name,
                s.job.seed,
                loop.streak,
                step,
            )
        return StepResult(lr, nan, False)
    loop.streak = 0
    loop.overflow += u.overflow
    loop.clipped += int(u.clipped)
    loop.acc.add(u.means, u.grad_norm, u.clipped)
    if u.probe is None:
        return StepResult(lr, u.grad_norm, u.clipped)
    masked = diagnostics.masked_fraction(float(sum(o.n_masked for o in u.outs)), t.accum_steps * micro[0][2].numel())
    return StepResult(lr, u.grad_norm, u.clipped, diagnostics={**u.probe.finish(), M.MASKED_FRAC: masked})


def record(s: Setup, loop: Loop, step: int, result: StepResult, wall_time: float) -> dict | None:
    """A metrics row: the means since the previous row, this step's values and the fixed validation
    loss; appended to the loop's rows and to metrics.partial.csv. Only the writer records; the other
    processes flush their accumulators in step with it."""
    if not s.writer:
        loop.acc.flush()
        return None
    probe = diagnostics.ValidProbe(s.model) if s.t.diagnostics else contextlib.nullcontext()
    with probe:  # attention logits and codebook-0 accuracy, hooked into the validation pass
        v_bits = evaluate(s.model, *s.valid, s.precision)
    row = {
        M.STEP: step,
        **loop.acc.flush(),
        M.LR: result.lr,
        M.GRAD_NORM: result.grad_norm,
        M.CLIPPED: int(result.clipped),
    }
    row.update({M.loss_column("valid", k): float(b) for k, b in enumerate(v_bits)})
    if s.t.diagnostics:
        row.update({**(result.diagnostics or {}), **probe.values()})
    row.update(
        {
            M.CLIPPED_STEPS: loop.clipped,
            M.NONFINITE: loop.nonfinite,
            M.OVERFLOW_SKIPS: loop.overflow,
            M.LOSS_SCALE: _loss_scale(s),
            M.DIVERGED: int(loop.diverged_at is not None),
            M.WALL_TIME: wall_time,
        }
    )
    loop.rows.append(row)
    write_partial(s.job.out_dir, loop.rows)  # visible progress, never the final name; a full disk: one line
    return row


def _loss_scale(s: Setup) -> float:
    """The loss scale now (NaN without one), as fairseq logs `loss_scale`."""
    return s.tr.loss_scale


def checkpoint(s: Setup, loop: Loop, step: int) -> None:
    """The resumable state after `step`: the loop, model, optimizer, precision (loss scaler, master
    weights) and RNG (state.py)."""
    save_state(
        s.job.state_dir,
        step,
        {
            "fingerprint": s.fingerprint,
            **loop.state(),
            "model": s.model.state_dict(),
            "optimizer": s.opt.state_dict(),
            **s.precision.state_dict(),
            "rng": rng_state(s.device),
        },
    )


def finish(s: Setup, loop: Loop) -> dict:
    """The seed's final checkpoint, metrics.csv and summary.json (last: it marks the seed complete)."""
    if s.job.world > 1:
        dist.barrier()
    if not s.writer:
        return {"seed": s.job.seed}
    metrics = pd.DataFrame(loop.rows)
    weights = s.precision.fp32_state_dict()  # in fp32 (fairseq's precision: its fp32 master weights)
    write_checkpoint(
        s.job.out_dir,
        {
            "model": weights,
            "model_config": C.to_dict(s.m),
            "train_config": C.to_dict(s.t),
            "run": C.to_dict(s.rc),
            "step": loop.diverged_at or s.t.steps,
        },
    )
    summary = {**summarize(metrics, s.rc, s.t), "stop_reason": loop.stop_reason, "fingerprint": s.fingerprint}
    write_metrics(s.job.out_dir / METRICS, metrics)
    write_summary(s.job.out_dir / SUMMARY, summary)
    remove_partial(s.job.out_dir)
    shutil.rmtree(s.job.state_dir, ignore_errors=True)  # the seed is complete: nothing to resume
    final = summary["final_train_loss_cb0"]
    log.info(
        "train %s: %s in %.0f s, final codebook-0 loss %s",
        s.job.run_name,
        summary["status"],
        summary["wall_time_s"],
        "none (no finite loss)" if final is None else f"{final:.3f} bits",
    )
    return summary
