"""The schedules of a run: the learning rate of each update (fairseq's polynomial decay) and the
steps that get a metrics row."""

from __future__ import annotations

from acoustic_mlm import config as C


def lr_at(step: int, t: C.TrainConfig) -> float:
    """fairseq `polynomial_decay` (fairseq/optim/lr_scheduler/polynomial_decay_schedule.py): linear
    warm-up to `lr` over warmup_steps, then (1 - progress)^power down to `end_lr` at
    train.total_updates (fairseq `total_num_update` = `max_update`; default train.steps).

    `step` counts optimizer updates from 1 (fairseq sets the lr of update n+1 from n updates done:
    one update later than here).
    """
    if t.warmup_steps > 0 and step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.schedule_updates - t.warmup_steps)
    progress = min(max(progress, 0.0), 1.0)
    return t.end_lr + (t.lr - t.end_lr) * (1.0 - progress) ** t.lr_power


def log_steps(steps: int, interval: int, powers_of_two: bool = True) -> list[int]:
    """Steps that get a metrics row: multiples of `interval`, the last, and (powers_of_two) 1, 2, 4, ...

    Without powers of two every row but possibly the last covers exactly `interval` updates, as
    fairseq's `train_inner` rows (fairseq_cli/train.py: a row when num_updates % log_interval == 0).
    """
    out = {steps}
    p = 1
    while powers_of_two and p <= steps:
        out.add(p)
        p *= 2
    out.update(range(interval, steps + 1, interval))
    return sorted(out)
