"""preflight's summary in the log: the data side, the sweep's projection, the sweep's models that do not fit,
and the figure's hours, one line each. Every projected GPU number says the share of the peak it assumes and
whether that share was measured (`preflight.measured`)."""

from __future__ import annotations

from pathlib import Path

from acoustic_mlm.utils import log


def log_summary(result: dict, out_dir: Path) -> None:
    """A line for the data, for the sweep's projection, if any, and one for the figure (projected in place of
    the preset's GPU)."""
    sweep, projection, figure = result["sweep_projection"], result["gpu_projection"], result["figure"]
    data = result["data"]
    if "epochs" in data:
        log.info(
            "preflight: data %s (%.0f h of audio): download %s GB, disk %s GB at the peak, %s GB when done, %s GB "
            "free at %s%s; prepare %.3g h and tokenize %.3g h on %d CPU cores (tokenize on one %s: %s, projected); "
            "the preset's updates are %.3g epochs of it",
            data["source"],
            data["corpus_hours"],
            number(data["download_gb"]),
            number(data["peak_disk_gb"]),
            number(data["final_disk_gb"]),
            number(data["free_gb"]),
            data["free_where"],
            "" if data["disk_fits"] else " (the peak does not fit)",
            data["prepare_hours"],
            data["tokenize_hours"],
            data["cores"],
            data["tokenize_gpu"],
            hours(data["tokenize_gpu_hours"]),
            data["epochs"],
        )
    if sweep is not None:
        g = sweep["gpus"][0]
        log.info(
            "preflight: the sweep's %d points (%d runs) project to %s GPU-hours on one %s at %s",
            sweep["points"],
            sweep["runs"],
            number(g["gpu_hours"]),
            g["gpu"],
            share(g),
        )
    for row in result.get("sweep_models") or []:
        if row["fits"] is False:
            log.warning(
                "preflight: the sweep's %d-layer model (%d points, e.g. %s) does not fit at micro-batch %s; "
                "suggested micro-batch %s",
                row["layers"],
                len(row["points"]),
                row["measured_as"],
                row["fits_at_micro_batch"],
                row["suggested_micro_batch"],
            )
    if projection is not None:
        best = projection[0]
        mem = result["arms"][0]["gpu_memory"]
        log.info("preflight: %s", result["measurement"])
        log.info(
            "preflight: projected GPU memory per process %.1f GB (%s)",
            mem["total_gb"],
            ", ".join(f"{g['gpu']}: {'fits' if g['fits'] else 'does not fit'}" for g in mem["gpus"]),
        )
        log.info(
            "preflight: measured on CPU (CPU times); projected on %s: the figure takes %s on %d GPU(s) "
            "(%s GPU-hours) at %s; results in %s",
            best["gpu"],
            hours(best["wall_hours"]),
            figure["gpus"],
            number(best["gpu_hours"]),
            share(best),
            out_dir / "preflight.md",
        )
        return
    if result["cpu_times"]:  # a CPU preset: process-hours on this CPU, no GPU involved
        where = f"on this CPU ({figure['processes']} process(es) per run, {hours(figure['gpu_hours'])} of processes)"
    else:
        where = f"on {figure['gpus']} GPU(s) ({number(figure['gpu_hours'])} GPU-hours, measured here)"
    log.info(
        "preflight: the figure takes %s %s; results in %s", hours(figure["wall_hours"]), where, out_dir / "preflight.md"
    )


def share(row: dict) -> str:
    """The share of the peak a projection row uses and where it comes from, with the measured MFUs beside an
    assumed one and the GPU-hours at the lowest of them."""
    pct = f"{100 * row['utilisation']:.3g} % of its peak"
    source = row.get("utilisation_source", "assumed")
    if source != "assumed":
        return f"{pct} ({source})"
    if "measured_mfu" not in row:
        return f"an assumed {pct}"
    return (
        f"an assumed {pct} ({row['measured_mfu']}; at {100 * row['lowest_measured']:.3g} %: "
        f"{number(row['gpu_hours_at_lowest_measured'])} GPU-hours)"
    )


def hours(h: float) -> str:
    """A duration: seconds under a minute, minutes under an hour, hours above (never '0.0 h')."""
    if h < 1 / 60:
        return f"{3600 * h:.2g} s"
    return f"{60 * h:.1f} min" if h < 1 else f"{h:,.1f} h"


def number(x: float) -> str:
    """GPU-hours: three significant digits under 100, whole numbers with separators above."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
