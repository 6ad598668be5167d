"""Validation: a configuration mapping checked before any work, every failure one line that names
the file and the key.

Two layers: the JSON schema generated from the dataclasses (config/schema.py: types, ranges, enums,
unknown keys) and the rules across
fields below, one function per section (the conv stack must stride 320, one arm per role, ...).
The `check_*` functions of one value are also used for settings derived from the configuration
(a sweep's run names, say).
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from typing import Any

from acoustic_mlm import encodec
from acoustic_mlm.config.schema import generate as generate_schema
from acoustic_mlm.config.sections import ClaimThresholds, world_size
from acoustic_mlm.config.steps import result_keys
from acoustic_mlm.errors import ConfigError
from acoustic_mlm.model.config import cqt_top_frequency, mask_groups, total_stride

# Keys of earlier versions, with what replaced them (a config still using one gets this sentence).
RENAMED_RUN_KEYS = {
    "deepnorm": "'norm: deepnorm' (norm is pre | post | deepnorm)",
    "attn_relax": "'attention: pb_relax' (attention is softmax | pb_relax | unfused | qk_norm)",
}
# Keys of earlier versions renamed with their values unchanged: old dotted key -> new dotted key. A
# config still using one gets a sentence naming the new key; settings recorded under the old names
# (a reference run's, report.verify) are read through `renamed_settings`.
RENAMED_KEYS = {
    "tokenizer.level": "tokenizer.loudness",  # "level" is an RVQ level (a codebook); this is loudness normalisation
    "tokenizer.level_target": "tokenizer.loudness_target",
}


def validate(cfg: Any, source: str = "config") -> dict:
    """Check a configuration mapping; raise ConfigError (one line) on the first problem.

    Keys of earlier versions first (the schema would call them unknown) and non-finite numbers (the
    schema lets NaN through), then the schema, then the rules across fields section by section, last
    every point of a sweep as a configuration of its own.
    """
    _check_key_names(cfg, source)
    _check_renamed_keys(cfg, source)
    check_finite(cfg, source)
    _check_schema(cfg, source)
    _check_sizes(cfg, source)
    _check_data(cfg, source)
    _check_arms(cfg, source)
    _check_model(cfg, source)
    _check_train(cfg, source)
    _check_recipe(cfg, source)
    _check_crop(cfg, source)
    _check_tokenizer(cfg, source)
    _check_claims(cfg, source)
    _check_figure(cfg, source)
    check_codebooks(cfg, source)
    check_labels(cfg, source)
    _check_arm_names(cfg, source)
    check_seeds(cfg, source)
    _check_sweep(cfg, source)
    return cfg


# ----------------------------------------------------------------------------- the schema


@lru_cache(maxsize=1)
def _schema() -> dict:
    """The JSON schema generated from the dataclasses (config/schema.py; the shipped file is the same)."""
    return generate_schema()


def schema() -> dict:
    """The JSON schema every configuration is checked against (a copy)."""
    return json.loads(json.dumps(_schema()))


def _key_path(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def _check_renamed_keys(cfg: Any, source: str) -> None:
    """Keys of earlier versions get a sentence saying what replaced them, not 'unknown key'."""
    claims = cfg.get("claims") if isinstance(cfg, dict) else None
    if isinstance(claims, dict) and "final_fraction" in claims:
        raise ConfigError(
            f"{source}: 'claims.final_fraction' was removed: the final loss has one definition, the "
            "mean over the last 10% of the steps (acoustic_mlm.curves); delete the key"
        )
    runs = cfg.get("runs") if isinstance(cfg, dict) else None
    for name, run in runs.items() if isinstance(runs, dict) else ():
        for old in RENAMED_RUN_KEYS:
            if isinstance(run, dict) and old in run:
                raise ConfigError(f"{source}: 'runs.{name}.{old}' was replaced by {RENAMED_RUN_KEYS[old]}")
    for old, new in RENAMED_KEYS.items():
        *parents, last = old.split(".")
        node = cfg
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            raise ConfigError(f"{source}: '{old}' was renamed to '{new}' (the values are the same)")


# Keys added since settings were first recorded, each with the value that does what the versions
# before it did: dotted key -> that value. Settings recorded before a key existed (a reference run's,
# report.verify) get it through `renamed_settings`, so that they compare equal to a run of today's
# config that keeps the old behaviour.
ADDED_KEYS = {
    "data.sample_format": "float32",  # prepared audio was float32 before int16 could be chosen
}


def renamed_settings(settings: dict) -> dict:
    """{dotted key: value} recorded by an earlier version, its renamed keys (RENAMED_KEYS) under
    their new names, in the same order; then each key added since (ADDED_KEYS) that it lacks, with
    the value of the old behaviour."""
    out = {RENAMED_KEYS.get(key, key): value for key, value in settings.items()}
    return {**out, **{key: value for key, value in ADDED_KEYS.items() if key not in out}}


def _check_schema(cfg: Any, source: str) -> None:
    """The JSON schema's first failure (the shallowest key first) as one line, then whole numbers."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(list(e.absolute_path)), str(e.absolute_path)))
    if errors:
        err = errors[0]
        where = _key_path(err)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            key = f"{where}.{extra[0]}" if where != "<top level>" else extra[0]
            raise ConfigError(f"{source}: unknown key '{key}'")
        if err.validator == "required":
            missing = [k for k in err.validator_value if k not in err.instance]
            key = f"{where}.{missing[0]}" if where != "<top level>" else missing[0]
            raise ConfigError(f"{source}: missing key '{key}'")
        from acoustic_mlm.config.sweep import text_number  # the sweep's values are read the same way

        if err.validator == "type" and isinstance(err.instance, str) and text_number(err.instance) is not None:
            raise ConfigError(f"{source}: '{where}' holds {err.instance!r}, {text_number(err.instance)}")
        raise ConfigError(f"{source}: '{where}': {err.message}")
    check_integers(cfg, _schema(), source)


def _check_key_names(cfg: Any, source: str, where: str = "") -> None:
    """Every key of every mapping is a string: YAML reads `true:`, `1:`, `null:` or `1.5:` as a boolean,
    number or null, which no key (and no run name) can be."""
    if isinstance(cfg, list):
        for i, item in enumerate(cfg):
            _check_key_names(item, source, f"{where}[{i}]")
        return
    if not isinstance(cfg, dict):
        return
    for key, value in cfg.items():
        if not isinstance(key, str):
            kinds = {type(None): "null", bool: "a boolean", int: "a whole number", float: "a number"}
            kind = kinds.get(type(key), f"a {type(key).__name__}")
            try:
                written = json.dumps(key)
            except (TypeError, ValueError):
                written = repr(key)
            raise ConfigError(
                f"{source}: the key {written} under '{where or '<top level>'}' is read by YAML as {kind}, "
                f"not a name; quote it ('{written}') or rename it"
            )
        _check_key_names(value, source, f"{where}.{key}" if where else key)


# ----------------------------------------------------------------------------- rules across fields, by section


def _check_data(cfg: dict, source: str) -> None:
    """The data source names where its audio comes from."""
    d = cfg["data"]
    if d["source"] == "url" and not (d["url"] and d["known_hash"]):
        raise ConfigError(f"{source}: 'data.source' is url: set 'data.url' and 'data.known_hash' (sha256:<hex>)")
    if d["source"] == "folder" and not d["folder"]:
        raise ConfigError(f"{source}: 'data.source' is folder: set 'data.folder'")
    if d["source"] == "tones":  # one tone per EnCodec frame of 320 samples at 24 kHz (data/tones.py)
        syn = d["synthetic"]
        if syn["sample_rate"] != encodec.SAMPLE_RATE:
            raise ConfigError(
                f"{source}: 'data.synthetic.sample_rate' must be {encodec.SAMPLE_RATE} for data.source tones"
            )
        frames = syn["clip_seconds"] * encodec.FRAME_RATE
        if abs(frames - round(frames)) > 1e-6:
            raise ConfigError(
                f"{source}: 'data.synthetic.clip_seconds' is not a whole number of EnCodec frames (data.source tones)"
            )


def _check_arms(cfg: dict, source: str) -> None:
    """One arm per paper's curve (role), and legend labels that tell the arms apart."""
    seen_roles: dict[str, str] = {}
    for name, run in cfg["runs"].items():
        role = run.get("role")
        if role is not None and role in seen_roles:
            raise ConfigError(
                f"{source}: 'runs.{name}.role' is {role}, as is 'runs.{seen_roles[role]}.role': "
                "each of the paper's curves is reproduced by one arm"
            )
        if role is not None:
            seen_roles[role] = name
    labels = [r["label"] for r in cfg["runs"].values()]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"{source}: 'runs': two arms share a label; legend labels must be unique")


def _check_model(cfg: dict, source: str) -> None:
    """Features on EnCodec's frames, and widths the heads and the positional convolution divide."""
    m = cfg["model"]
    stride = total_stride(m["conv_layers"])
    if stride != encodec.HOP:
        raise ConfigError(
            f"{source}: 'model.conv_layers' strides multiply to {stride}; they must multiply to "
            f"{encodec.HOP} so that features align with EnCodec's 75 Hz frames"
        )
    if m["dim"] % m["heads"]:
        raise ConfigError(f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.heads' ({m['heads']})")
    if m["dim"] % m["pos_conv_groups"]:
        raise ConfigError(
            f"{source}: 'model.dim' ({m['dim']}) must be divisible by 'model.pos_conv_groups' ({m['pos_conv_groups']})"
        )


def _check_train(cfg: dict, source: str) -> None:
    """A micro-batch the processes share evenly, and a schedule longer than its warm-up and the run."""
    t = cfg["train"]
    world = world_size(t)
    if t["batch_size"] % world:
        raise ConfigError(
            f"{source}: 'train.batch_size' ({t['batch_size']}) must be divisible by the {world} "
            "processes "
            "('train.nodes' x 'train.processes'): it is the global micro-batch, split between them"
        )
    total = t.get("total_updates") or t["steps"]
    if t["warmup_steps"] >= total:
        key = "train.total_updates" if t.get("total_updates") else "train.steps"
        raise ConfigError(f"{source}: 'train.warmup_steps' ({t['warmup_steps']}) must be below '{key}' ({total})")
    if t["steps"] > total:
        raise ConfigError(f"{source}: 'train.steps' ({t['steps']}) must not exceed 'train.total_updates' ({total})")


def _check_recipe(cfg: dict, source: str) -> None:
    """Cross-field rules of the MERT recipe switches: mask groups, noise mixing, CQT bins (docs/recipe.md)."""
    m, t = cfg["model"], cfg["train"]
    groups = mask_groups(t["batch_size"], t["mask_group"])
    world = world_size(t)
    if len(groups) % world and (t["mask_group"] or m["mixture_prob"] > 0):
        raise ConfigError(
            f"{source}: 'train.mask_group' ({t['mask_group']}) splits 'train.batch_size' ({t['batch_size']}) into "
            f"{len(groups)} groups, which the {world} processes ('train.nodes' x 'train.processes') must divide "
            "(each process holds whole groups)"
        )
    if m["mixture_prob"] > 0:
        crop = crop_frames(cfg) * encodec.HOP
        (n_min, n_max), (len_min, len_max) = m["mixture_segments"], m["mixture_samples"]
        if n_min > n_max or len_min > len_max:
            raise ConfigError(
                f"{source}: 'model.mixture_segments' and 'model.mixture_samples' must be [min, max] ranges"
            )
        if len_max > crop:
            raise ConfigError(
                f"{source}: 'model.mixture_samples' reaches {len_max} samples, longer than a crop ({crop})"
            )
        smallest = min(len(g) for g in groups)
        if (smallest - 1) * crop < len_max:
            raise ConfigError(
                f"{source}: 'model.mixture_prob' > 0 needs groups ('train.mask_group') of crops whose others hold "
                f"{len_max} samples of noise ('model.mixture_samples'); the smallest group has {smallest} crops"
            )
    try:
        top = cqt_top_frequency(m["cqt_fmin"], m["cqt_bins"], m["cqt_bins_per_octave"])
    except OverflowError:  # thousands of octaves above cqt_fmin: past any Nyquist
        top = math.inf
    if m["cqt_loss_weight"] > 0 and top >= cfg["data"]["sample_rate"] / 2:
        raise ConfigError(f"{source}: 'model.cqt_bins' reach {top:.0f} Hz, above Nyquist of 'data.sample_rate'")


def _check_crop(cfg: dict, source: str) -> None:
    """A crop holds at least two mask spans."""
    if crop_frames(cfg) < 2 * cfg["model"]["mask_length"]:
        raise ConfigError(f"{source}: 'train.crop_seconds' is too short for 'model.mask_length' spans")


def _check_tokenizer(cfg: dict, source: str) -> None:
    """A calibrated tokenizer sees at least one frame per code it fits; the pitch tokenizer reads the tone corpus."""
    tok, size = cfg["tokenizer"], cfg["model"]["codebook_size"]
    if tok["mode"] == "pitch" and cfg["data"]["source"] != "tones":
        raise ConfigError(
            f"{source}: 'tokenizer.mode' is pitch, the tone corpus's oracle: it reads only 'data.source' tones "
            f"(not {cfg['data']['source']})"
        )
    if tok["mode"] == "calibrated" and tok["calibration_frames"] < size:
        raise ConfigError(f"{source}: 'tokenizer.calibration_frames' must be at least 'model.codebook_size' ({size})")


def _check_claims(cfg: dict, source: str) -> None:
    """The verdicts' thresholds (ClaimThresholds checks them)."""
    try:
        ClaimThresholds.from_dict(cfg["claims"])
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _check_figure(cfg: dict, source: str) -> None:
    f = cfg["figure"]
    if f["y_min"] is not None and f["y_max"] is not None and f["y_min"] >= f["y_max"]:
        raise ConfigError(f"{source}: 'figure.y_min' must be below 'figure.y_max'")


def _check_arm_names(cfg: dict, source: str) -> None:
    """Every arm's name is a folder name and its label fits the legend."""
    for name, run in cfg["runs"].items():
        check_run_name(name, source, f"runs.{name}")
        check_label_length(run["label"], source, f"runs.{name}.label")


def _check_sweep(cfg: dict, source: str) -> None:
    """Every point of a sweep passes the checks a file of its settings would, and sweeps only training
    settings; linear in the points (sweep.validate_points): the file itself passed every check above,
    so each swept value is checked once against its key's schema, and each point by the rules its
    values can change (_POINT_CHECKS)."""
    if cfg.get("sweep") is not None:
        from acoustic_mlm.config.sweep import (
            validate_points,  # the sweep's points are validated as files are, by this function
        )

        train_keys = [k for k in result_keys("train", cfg) if k.startswith(("model.", "train."))]
        validate_points(cfg, source, _check_point, allowed=train_keys, check_value=_check_swept_value)


def _check_point(cfg: dict, source: str) -> None:
    """The rules across keys that read model., train. or runs: (what a sweep point changes: model./train.
    values, and runs: holding the point). The rest of validate reads only sections a point shares with
    its file (data, claims, figure; the labels and roles of its arm), which passed already."""
    for check in (
        _check_sizes,  # first, as for the file: a swept size a machine cannot hold is refused before any rule allocates
        _check_model,
        _check_train,
        _check_recipe,
        _check_crop,
        _check_tokenizer,
        check_codebooks,
        _check_arm_names,
        check_seeds,
    ):
        check(cfg, source)


@lru_cache(maxsize=4096)
def _value_problem(key: str, kind: str, text: str) -> str | None:
    """Why one value (its type's name and JSON text) is refused for a model./train. key, or None."""
    import jsonschema

    section, leaf = key.split(".", 1)
    sub = _schema()["properties"].get(section, {}).get("properties", {}).get(leaf)
    value = json.loads(text)
    if kind == "float":
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f"holds {value}; it must be a finite number"
    if sub is None:
        return None
    errors = list(jsonschema.Draft202012Validator(sub).iter_errors(value))
    if errors:
        return errors[0].message
    try:
        check_integers(value, sub)
    except ConfigError:
        return f"holds {value!r}; it must be a whole number, written without a decimal point"
    return None


def key_value_problem(key: str, value) -> str | None:
    """Why one value is refused for a section.leaf key, by the rules a file's value meets there: its
    schema, finiteness, whole numbers, and its ceiling (SIZE_CEILINGS); None if it is taken. A sweep's
    values and the command-line options that stand for a key (--threads) are checked by it."""
    problem = _value_problem(key, type(value).__name__, json.dumps(value))
    if problem is None and key in SIZE_CEILINGS and isinstance(value, (int, float)) and not isinstance(value, bool):
        ceiling, why = SIZE_CEILINGS[key]
        if value > ceiling:
            problem = f"{value} is more than {ceiling:,} ({why})"
    return problem


def _check_swept_value(key: str, value, source: str, where: str) -> None:
    """One value of a sweep's grid, checked once against its key's rules (a point holding it would fail so)."""
    problem = key_value_problem(key, value)
    if problem:
        raise ConfigError(f"{source}: '{where}': {problem}")


# ----------------------------------------------------------------------------- what a machine can hold
#
# The schema gives sizes a floor only; a few extra zeros would otherwise reach an allocation (a
# MemoryError traceback, sometimes inside these checks) or a run that never answers. Each bound has its
# reason; the memory bound is a lower estimate of what one process must hold, so a refusal is certain.

GiB = 1 << 30
MAX_DEVICE_BYTES = 192 * GiB  # the largest memory of one accelerator today (192 GB): a GPU run's process must fit it
SIZE_CEILINGS = {  # dotted key -> (ceiling, why)
    "train.threads": (1024, "more threads than the largest CPUs have"),
    "tokenizer.threads": (1024, "more threads than the largest CPUs have"),
    "train.workers": (256, "each loader worker is a process holding the corpus's index"),
    "train.processes": (64, "processes per node: one per accelerator, and no node holds more than 64"),
    "train.nodes": (16384, "more nodes than the largest clusters have"),
    "train.steps": (10**8, "250 times MERT's 400K updates; a run's metrics rows are held in memory"),
    "train.accum_steps": (65536, "a sane ceiling: 65,536 micro-batches per update"),
    "model.layers": (4096, "a sane ceiling, 170 times MERT-330M's 24 layers"),
    "model.dim": (65536, "a sane ceiling, 64 times MERT-330M's width"),
    "model.ffn_dim": (262144, "a sane ceiling, 64 times MERT-330M's"),
    "model.final_dim": (65536, "a sane ceiling"),
    "model.codebook_size": (1 << 20, "a sane ceiling, 1,024 times EnCodec's 1,024 codes"),
    "model.pos_conv_kernel": (4096, "a sane ceiling, 32 times wav2vec 2.0's 128"),
    "model.special_symbols": (1 << 20, "a sane ceiling"),
    "model.cqt_bins": (4096, "a sane ceiling, 12 times MERT's 336"),
    "tokenizer.calibration_frames": (10**8, "k-means holds every calibration frame's 128 values in memory"),
    "tokenizer.batch_size": (1 << 16, "a sane ceiling"),
    "data.shard_files": (10**7, "a sane ceiling"),
}
MAX_CROP_SECONDS = 3600.0  # an hour per crop: MERT's are 5.12 s


def _check_sizes(cfg: dict, source: str) -> None:
    """Sizes within what a machine can hold (SIZE_CEILINGS, MAX_CROP_SECONDS), then the memory one
    training process needs at least against what its device can have (memory_floor_bytes)."""
    for key, (ceiling, why) in SIZE_CEILINGS.items():
        section, leaf = key.split(".")
        value = cfg[section].get(leaf)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > ceiling:
            raise ConfigError(f"{source}: '{key}' is {value}; at most {ceiling:,} ({why})")
    t = cfg["train"]
    for key in ("crop_seconds",):
        if t[key] > MAX_CROP_SECONDS:
            raise ConfigError(
                f"{source}: 'train.{key}' is {t[key]}; at most {MAX_CROP_SECONDS:g} (an hour of audio a crop)"
            )
    need, parts = memory_floor_bytes(cfg)
    have, device = device_bytes(t["device"])
    if need > have:
        raise ConfigError(
            f"{source}: one training process needs at least {need / GiB:,.1f} GiB ({parts}), more than "
            f"{device} holds ({have / GiB:,.0f} GiB); lower 'train.batch_size', 'train.crop_seconds', "
            "'train.valid_crops', 'model.dim' or 'model.layers' (or raise 'train.accum_steps' or the processes)"
        )


def device_bytes(device: str) -> tuple[int, str]:
    """What one process's device can hold: this machine's memory for cpu; for cuda or auto, the larger
    of it and MAX_DEVICE_BYTES (the run's GPU is not known here: preflight measures it)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 0
    if device == "cpu":
        return (ram or MAX_DEVICE_BYTES), "this machine's memory"
    return max(ram, MAX_DEVICE_BYTES), "any one accelerator or this machine"


def memory_floor_bytes(cfg: dict) -> tuple[float, str]:
    """A lower estimate of one training process's memory, and its parts in words: the parameters with
    their gradients and Adam's two moments (16 bytes each in fp32), the first conv's output and the
    encoder's residual stream (4 bytes a value, each layer's kept for the backward pass) for one
    micro-batch, and the fixed validation crops' audio."""
    m, t = cfg["model"], cfg["train"]
    dim, layers, ffn = m["dim"], m["layers"], m["ffn_dim"]
    channels = [c for c, _, _ in m["conv_layers"]]
    conv = sum(c_in * c_out * k for (c_in, (c_out, k, _)) in zip([1] + channels, m["conv_layers"]))
    params = (
        conv + layers * (4 * dim * dim + 2 * dim * ffn) + m["codebooks"] * m["final_dim"] * (dim + m["codebook_size"])
    )
    world = max(1, t["processes"] * t["nodes"])
    micro = max(1, math.ceil(t["batch_size"] / world))
    samples = t["crop_seconds"] * cfg["data"]["sample_rate"]
    first_stride = m["conv_layers"][0][2] if m["conv_layers"] else 1
    frames = samples / max(1, total_stride(m["conv_layers"]))
    conv_act = micro * samples / first_stride * channels[0] * 4 if channels else 0
    encoder_act = micro * frames * dim * layers * 4
    valid = t["valid_crops"] * samples * 4
    need = params * 16 + conv_act + encoder_act + valid
    parts = (
        f"{params / 1e6:,.0f}M parameters x 16 bytes, {(conv_act + encoder_act) / GiB:,.1f} GiB of activations for "
        f"{micro} crops of {t['crop_seconds']:g} s, {valid / GiB:,.1f} GiB of validation audio"
    )
    return need, parts


# ----------------------------------------------------------------------------- limits of later stages
#
# Values the schema accepts but a later stage cannot use. Each check is a function of one value, so
# that settings derived from the config (a sweep's run names, say) can be checked the same way.

# A run name is a file name in results/runs/<run>/, results/logs/train/<run>.log and DVC's
# train@<run>: the longest, <run>.log, must fit the 255-byte name limit of common file systems.
MAX_RUN_NAME_BYTES = 255 - len(".log")
# torch.manual_seed takes seeds in [-2^63, 2^64 - 1]; training seeds process r with seed + r * 1,000,003.
TORCH_SEED_MAX = 2**64 - 1
RANK_SEED_STRIDE = 1_000_003
# The legend draws each label on one line: four labels of 60 wide characters (W) fill about 70 % of
# the figure's width, the legend still above the curves (drawn and looked at); the presets' labels
# have 32-42. A label of 10,000 characters covered the plot and pushed the other arms off the image.
MAX_LABEL_CHARS = 60


def check_run_name(name: str, source: str = "config", key: str | None = None) -> None:
    """A run name (given or derived) that every results path can hold: at most MAX_RUN_NAME_BYTES
    bytes of UTF-8, no '/' or NUL, not '.' or '..'."""
    key = key if key is not None else f"runs.{name}"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_RUN_NAME_BYTES:
        raise ConfigError(
            f"{source}: '{shorten(key)}': the run name is {size} bytes; at most {MAX_RUN_NAME_BYTES} "
            "(results/logs/train/<run>.log must fit the file system's 255-byte name limit); shorten it"
        )
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ConfigError(f"{source}: '{shorten(key)}': {name!r} cannot be a folder name; use letters, digits and _")


def check_seed(seed: int, source: str = "config", key: str = "seed", processes: int = 1) -> None:
    """A seed torch accepts in every one of `processes` DDP processes (seed + rank * 1,000,003)."""
    top = TORCH_SEED_MAX - RANK_SEED_STRIDE * (processes - 1)
    if not 0 <= seed <= top:
        raise ConfigError(
            f"{source}: '{key}' has seed {seed}; seeds run from 0 to {top} (torch.manual_seed takes "
            f"at most 2^64 - 1{', less 1000003 per further process' if processes > 1 else ''})"
        )


def check_seeds(cfg: dict, source: str = "config") -> None:
    t = cfg["train"]
    world = world_size(t)
    for name, run in cfg["runs"].items():
        for seed in run["seeds"]:
            check_seed(seed, source, f"runs.{name}.seeds", world)
    check_seed(cfg["tokenizer"]["seed"], source, "tokenizer.seed")


def check_label_length(label: str, source: str = "config", key: str = "label") -> None:
    """A legend label the figure can draw beside the curves (MAX_LABEL_CHARS characters, one line)."""
    if len(label) > MAX_LABEL_CHARS or "\n" in label:
        what = "holds a line break" if "\n" in label else f"is {len(label)} characters long"
        raise ConfigError(
            f"{source}: '{key}' {json.dumps(shorten(label))} {what}; the legend draws one line of at "
            f"most {MAX_LABEL_CHARS} characters: shorten it (the run name can carry the rest)"
        )


# ----------------------------------------------------------------------------- checks the schema cannot express


def _dotted(parts: tuple) -> str:
    return ".".join(str(p) for p in parts) if parts else "<top level>"


def shorten(value, limit: int = 60) -> str:
    """A value as text of at most `limit` characters (cut with '...'), for one-line errors."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_finite(cfg: Any, source: str = "config", at: tuple = ()) -> None:
    """Refuse NaN and infinity anywhere: JSON schema ranges let NaN through (every comparison is false)."""
    if isinstance(cfg, float) and not math.isfinite(cfg):
        raise ConfigError(f"{source}: '{_dotted(at)}' is {cfg}; it must be a finite number")
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            check_finite(v, source, at + (k,))
    elif isinstance(cfg, list):
        for i, v in enumerate(cfg):
            check_finite(v, source, at + (i,))


def check_integers(cfg: Any, schema: dict, source: str = "config", at: tuple = ()) -> None:
    """Refuse a float where the schema asks for an integer. JSON schema counts 150.0 as an
    integer, but the code would receive a float (range(150.0) fails deep inside training)."""
    kind = schema.get("type")
    wants_int = (
        kind == "integer"
        or (isinstance(kind, list) and "integer" in kind)
        or (isinstance(schema.get("const"), int) and not isinstance(schema.get("const"), bool))
    )
    if isinstance(cfg, float) and wants_int:
        raise ConfigError(
            f"{source}: '{_dotted(at)}' is {cfg!r}; it must be a whole number, written without a decimal point"
        )
    if isinstance(cfg, dict):
        props, other = schema.get("properties", {}), schema.get("additionalProperties")
        for k, v in cfg.items():
            sub = props.get(k, other if isinstance(other, dict) else None)
            if sub is not None:
                check_integers(v, sub, source, at + (k,))
    elif isinstance(cfg, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(cfg):
            check_integers(v, schema["items"], source, at + (i,))


def check_codebooks(cfg: dict, source: str = "config") -> None:
    """The model predicts codebooks the tokenizer will write (known before tokenize runs)."""
    m, bandwidth = cfg["model"], float(cfg["tokenizer"]["bandwidth"])
    have = encodec.codebooks(bandwidth)
    if m["codebooks"] > have:
        raise ConfigError(
            f"{source}: 'model.codebooks' is {m['codebooks']} but 'tokenizer.bandwidth' {bandwidth:g} kbps gives "
            f"{have} codebooks (EnCodec 24 kHz: 1.5/3/6/12/24 kbps give 2/4/8/16/32); lower model.codebooks "
            "or raise tokenizer.bandwidth"
        )
    if m["codebook_size"] < encodec.CODEBOOK_SIZE:
        raise ConfigError(
            f"{source}: 'model.codebook_size' is {m['codebook_size']} but EnCodec codes run from 0 "
            f"to {encodec.CODEBOOK_SIZE - 1}; set it to {encodec.CODEBOOK_SIZE}"
        )


def check_labels(cfg: dict, source: str = "config") -> None:
    """Every arm's label is drawn once with matplotlib's mathtext parser, as the figure will draw it
    in its legend, so a label it cannot render fails now rather than after training."""
    labels = {name: run["label"] for name, run in cfg["runs"].items() if "$" in run["label"]}
    if not labels:
        return  # plain text: nothing to parse (and no matplotlib import)
    try:
        from matplotlib import cbook
        from matplotlib.mathtext import MathTextParser
    except ImportError:  # e.g. Snakemake's own environment; every amlm stage has matplotlib and checks again
        return

    parser = MathTextParser("path")
    for name, label in labels.items():
        if not cbook.is_math_text(label):  # an odd number of unescaped '$' is drawn as plain text
            continue
        try:
            parser.parse(label)
        except ValueError as exc:
            why = " ".join([line for line in str(exc).splitlines() if line.strip()][-1].split())
            raise ConfigError(
                f"{source}: 'runs.{name}.label' \"{shorten(label)}\" cannot be drawn by matplotlib "
                f"({why}); fix the math or write a literal dollar sign as \\$"
            ) from None


def crop_frames(cfg: dict) -> int:
    """Frames in one training crop of a configuration mapping (Config.crop_frames once typed)."""
    return encodec.frames(cfg["train"]["crop_seconds"], cfg["data"]["sample_rate"])
