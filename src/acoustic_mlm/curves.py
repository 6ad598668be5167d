"""Statistics of one loss curve, each defined once: the run summaries, the claims and the README
all use these functions.

A curve is a run's logged rows: `steps` ascending, `loss` in bits at those steps.

    final loss      mean loss over the last FINAL_FRACTION (10 %) of the curve's step range
    converged step  the first logged step from which every later point stays within a margin of
                    the final loss, if that step comes before the final window (a curve that
                    enters the band only inside the window its final loss averages has not
                    been seen to stay there: not converged)
    spike           a point more than a threshold above the running minimum of the points
                    before it; recovered at the first later point within a margin of that minimum
    clipped share   clipped updates / updates taken (skipped non-finite updates are not updates)
    flattened       over the last quarter of the step range the loss moved by at most
                    FLAT_TOLERANCE (10 %) of its whole fall: |mean over the 10 % window ending at
                    75 % of the range - final loss| <= 0.1 x (first point - final loss), with a fall
                    > 0. A curve still falling fast, or rising again at the end, has not flattened.
"""

from __future__ import annotations

import math

import numpy as np

FINAL_FRACTION = 0.1  # the final loss averages the last 10 % of the step range
FLAT_TOLERANCE = 0.1  # flattened: the last quarter moved the loss by at most this share of its whole fall
_EPS = 1e-9  # float slack: 5.8 - 5.7 is 0.0999... and must count as within 0.1


def final_window_start(steps: np.ndarray) -> float:
    """First step of the final window: the last FINAL_FRACTION of the step range."""
    return float(steps[-1] - FINAL_FRACTION * (steps[-1] - steps[0]))


def final_loss(steps, loss) -> float:
    """Mean loss over the last FINAL_FRACTION of the step range (at least the last point)."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    return float(np.mean(loss[steps >= final_window_start(steps) - _EPS]))


def converged_step(steps, loss, final: float, margin: float) -> float:
    """First step from which every later point stays within `margin` of `final`; NaN when that
    step is not before the final window (or the curve never gets there)."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    outside = np.flatnonzero(np.abs(loss - final) > margin + _EPS)
    i = outside[-1] + 1 if len(outside) else 0
    if i >= len(steps) or steps[i] >= final_window_start(steps) - _EPS:
        return math.nan
    return float(steps[i])


def detect_spikes(steps, loss, threshold: float, recovery_margin: float) -> list[dict]:
    """Transient rises above the running minimum, in step order.

    A spike starts at a point more than `threshold` above the minimum of all points before it
    (`base`); it ends at the first later point within `recovery_margin` of `base`. Its peak is
    the highest point in between. Unrecovered spikes have `recovery_step` None.
    """
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    spikes, base, i = [], math.inf, 0
    while i < len(loss):
        if loss[i] - base > threshold:
            after = np.flatnonzero(loss[i + 1 :] <= base + recovery_margin + _EPS)
            end = i + 1 + after[0] if len(after) else len(loss)
            peak = i + int(np.argmax(loss[i:end]))
            spikes.append(
                {
                    "onset_step": int(steps[i]),
                    "peak_step": int(steps[peak]),
                    "peak_bits": float(loss[peak]),
                    "base_bits": float(base),
                    "height_bits": float(loss[peak] - base),
                    "recovery_step": int(steps[end]) if end < len(loss) else None,
                }
            )
            if end >= len(loss):
                break
            i = end  # the recovery point is the next candidate base
            continue
        base = min(base, loss[i])
        i += 1
    return spikes


def clipped_fraction(clipped_updates: int, updates: int) -> float:
    """Share of the updates taken whose gradient norm was clipped (NaN without updates)."""
    return clipped_updates / updates if updates else math.nan


def late_change(steps, loss) -> float:
    """Loss at 75 % of the step range (mean over the 10 % window ending there; the last point before
    it when no row falls inside) minus the final loss: how much the last quarter still lowered it."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    span = steps[-1] - steps[0]
    hi = steps[0] + 0.75 * span
    inside = (steps >= hi - FINAL_FRACTION * span - _EPS) & (steps <= hi + _EPS)
    if not inside.any():  # sparse rows: the last point at or before 75 %
        inside = np.zeros_like(inside)
        inside[int(np.flatnonzero(steps <= hi + _EPS)[-1])] = True
    return float(np.mean(loss[inside]) - final_loss(steps, loss))


def flattened(steps, loss) -> bool:
    """The curve has stopped falling: its last quarter changed it by at most FLAT_TOLERANCE of its
    whole fall (first point to final loss). Non-finite or non-falling curves have not flattened."""
    steps, loss = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    if len(steps) < 3 or not np.isfinite(loss).all():
        return False
    fall = float(loss[0]) - final_loss(steps, loss)
    return bool(fall > 0 and abs(late_change(steps, loss)) <= FLAT_TOLERANCE * fall + _EPS)
