"""The GPU presets are MERT's recipes: every setting named by the comparison with MERT's released
configs, its value as MERT's yaml or launch script states it (source in the comment), asserted
against config/paper.yaml (MERT-330M) and config/gpu-small.yaml (MERT-95M).

Sources (yizhilll/MERT):
  330M = mert_fairseq/config/pretrain/MERT_RVQ-VAE_CQT_330M.yaml
  95M  = mert_fairseq/config/pretrain/MERT_RVQ-VAE_CQT_95M.yaml
  MERTConfig = mert_fairseq/models/mert/mert_model.py (defaults of keys a yaml leaves out)
  fairseq = facebookresearch/fairseq: fairseq/dataclass/configs.py,
            fairseq/optim/lr_scheduler/polynomial_decay_schedule.py, fairseq/optim/fp16_optimizer.py
"""

import dataclasses

import pytest
import yaml
from helpers import load_benchmark

from acoustic_mlm import config as C
from acoustic_mlm.train import precision

MAX_TOKENS_330M = 900_000  # 330M dataset.max_tokens (scripts/run_training.sh passes 920,000: also 7 crops)
MAX_TOKENS_95M = 2_000_000  # 95M dataset.max_tokens


def _get(cfg: C.Config, key: str):
    """A dotted key's typed value; `runs.role=<role>.<key>` reads the arm of that role."""
    node = cfg
    for part in key.split("."):
        if part.startswith("role="):
            node = node[cfg.runs_by_role()[part[5:]]]
        elif isinstance(node, dict):
            node = node[part]
        else:
            node = getattr(node, part)
    return node


def _tuples(value):
    """A value as the typed configuration holds it: lists (the YAML's) as tuples."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _crop_samples(cfg):
    return round(cfg.train.crop_seconds * cfg.data.sample_rate)


def _world(cfg):
    return cfg.train.processes * cfg.train.nodes


def _crops_per_process(cfg):
    return cfg.train.batch_size // _world(cfg)


def _crops_per_update(cfg):
    return cfg.train.batch_size * cfg.train.accum_steps


def _scale_window(cfg):
    return precision.scale_window(_world(cfg), cfg.train.accum_steps)


# (key or derived quantity, MERT's value)
MERT_330M = [
    ("data.sample_rate", 24_000),  # 330M task.sample_rate
    (_crop_samples, 122_880),  # 330M task.max_sample_size (5.12 s, 384 frames)
    (_crops_per_process, MAX_TOKENS_330M // 122_880),  # 330M max_tokens / max_sample_size = 7 crops per GPU
    (_world, 64),  # 330M distributed_world_size 64, nprocs_per_node 8
    ("train.nodes", 8),  # 330M 64 / nprocs_per_node 8
    ("train.processes", 8),  # 330M nprocs_per_node
    ("train.accum_steps", 8),  # 330M optimization.update_freq [8]
    (_crops_per_update, 3_584),  # 64 x 7 x 8
    ("train.lr", 0.0015),  # 330M optimization.lr
    ("train.warmup_steps", 32_000),  # 330M lr_scheduler.warmup_updates
    ("train.total_updates", 400_000),  # 330M optimization.max_update (polynomial_decay total_num_update)
    ("train.steps", 100_000),  # the figure's x axis (arXiv 2306.00107): the first 100K of the 400K
    ("train.end_lr", 0.0),  # fairseq polynomial_decay end_learning_rate default
    ("train.lr_power", 1.0),  # fairseq polynomial_decay power default
    ("train.betas", [0.9, 0.98]),  # 330M optimizer.adam_betas
    ("train.eps", 1e-6),  # 330M optimizer.adam_eps
    ("train.weight_decay", 0.01),  # 330M optimizer.weight_decay
    ("runs.role=clip1.clip", 1.0),  # 330M optimization.clip_norm (the figure's clip-1 arms)
    ("train.precision", "fp16_fairseq"),  # 330M common.fp16 true
    (_scale_window, 32),  # fairseq fp16_optimizer.py: int(2**14 / 64 / 8) when fp16_scale_window is unset
    ("train.log_interval", 100),  # 330M common.log_interval
    ("train.log_powers_of_two", False),  # fairseq logs only every log_interval updates
    ("train.workers", 6),  # 330M dataset.num_workers
    ("model.conv_layers", [[512, 10, 5]] + [[512, 3, 2]] * 4 + [[512, 2, 2]] * 2),  # 330M conv_feature_layers
    ("model.dim", 1024),  # 330M encoder_embed_dim
    ("model.layers", 24),  # 330M encoder_layers
    ("model.heads", 16),  # 330M encoder_attention_heads
    ("model.ffn_dim", 4096),  # 330M encoder_ffn_embed_dim
    ("model.final_dim", 128),  # 330M final_dim
    ("model.logit_temp", 0.1),  # 330M logit_temp
    ("model.fp16_logits", True),  # mert_model.py compute_nce: cosine .type_as(x) (fp16), then /= logit_temp
    ("model.mask_prob", 0.8),  # 330M mask_prob
    ("model.mask_length", 5),  # 330M mask_length
    ("model.feature_penalty", 10.0),  # 330M criterion.loss_weights [10, 1]: features_pen 10
    ("model.relax_alpha", 32.0),  # 330M attention_relax 32.0
    ("model.pos_conv_kernel", 128),  # MERTConfig conv_pos default
    ("model.pos_conv_groups", 16),  # MERTConfig conv_pos_groups default
]

MERT_95M = [
    ("data.sample_rate", 24_000),  # 95M task.sample_rate
    (_crop_samples, 120_000),  # 95M task.max_sample_size (5 s, 375 frames)
    (_crops_per_update, 64 * (MAX_TOKENS_95M // 120_000)),  # 95M: 64 GPUs x 16 crops, no update_freq: 1,024
    (_scale_window, 256),  # fairseq: int(2**14 / 64 / 1); one GPU x 64 micro-batches gives the same
    ("train.lr", 0.0005),  # 95M optimization.lr
    ("train.warmup_steps", 32_000),  # 95M lr_scheduler.warmup_updates
    ("train.total_updates", 400_000),  # 95M optimization.max_update
    ("train.end_lr", 0.0),  # fairseq polynomial_decay end_learning_rate default
    ("train.lr_power", 1.0),  # fairseq polynomial_decay power default
    ("train.betas", [0.9, 0.98]),  # 95M optimizer.adam_betas
    ("train.eps", 1e-6),  # 95M optimizer.adam_eps
    ("train.weight_decay", 0.01),  # 95M optimizer.weight_decay
    ("runs.role=clip10.clip", 10.0),  # 95M optimization.clip_norm (the figure's clip-10 arm)
    ("train.precision", "fp16_fairseq"),  # 95M common.fp16 true
    ("train.log_interval", 200),  # 95M common.log_interval
    ("train.log_powers_of_two", False),  # fairseq logs only every log_interval updates
    ("train.workers", 6),  # 95M dataset.num_workers
    ("model.conv_layers", [[512, 10, 5]] + [[512, 3, 2]] * 4 + [[512, 2, 2]] * 2),  # 95M conv_feature_layers
    ("model.dim", 768),  # MERTConfig encoder_embed_dim default (95M leaves it)
    ("model.layers", 12),  # MERTConfig encoder_layers default
    ("model.heads", 12),  # MERTConfig encoder_attention_heads default
    ("model.ffn_dim", 3072),  # MERTConfig encoder_ffn_embed_dim default
    ("model.logit_temp", 0.1),  # 95M logit_temp
    ("model.fp16_logits", True),  # mert_model.py compute_nce: cosine .type_as(x) (fp16), then /= logit_temp
    ("model.mask_prob", 0.8),  # 95M mask_prob
    ("model.mask_length", 5),  # 95M mask_length
    ("model.feature_penalty", 10.0),  # 95M criterion.loss_weights [10, 1]
    ("model.dropout", 0.1),  # 95M dropout
    ("model.attention_dropout", 0.1),  # 95M attention_dropout
]

# Settings of the model, objective and data (dropouts, CQT loss, noise mixing, sample-level crops,
# masks per micro-batch, special symbols).
MODEL_SIDE_330M = [
    ("model.dropout", 0.0),  # 330M dropout
    ("model.attention_dropout", 0.0),  # 330M attention_dropout
    ("model.activation_dropout", 0.0),  # 330M activation_dropout
    ("model.encoder_layerdrop", 0.0),  # 330M encoder_layerdrop
    ("model.dropout_input", 0.0),  # 330M dropout_input
    ("model.feature_grad_mult", 1.0),  # 330M feature_grad_mult
    ("model.special_symbols", 4),  # fairseq Dictionary: <s>, <pad>, </s>, <unk> before the 1,024 codes
    ("model.cqt_loss_weight", 1.0),  # 330M audio_cqt_loss_m true, criterion.loss_weights [10, 1]: CQT 1
    ("model.cqt_bins", 336),  # 330M audio_cqt_bins
    ("model.mixture_prob", 0.5),  # 330M mixture_prob
    ("model.mixture_segments", [1, 3]),  # 330M inbatch_noise_augment_number_range
    ("model.mixture_samples", [12_000, 36_000]),  # 330M inbatch_noise_augment_len_range
    ("model.mixture_volume", 1.0),  # 330M inbatch_noise_augment_volume
    ("train.crop_unit", "sample"),  # 330M random_crop: crops start at any sample
    ("train.mask_group", 7),  # fairseq require_same_masks per GPU micro-batch: 7 crops (330M max_tokens)
]
MODEL_SIDE_95M = [
    ("model.activation_dropout", 0.0),  # 95M activation_dropout
    ("model.encoder_layerdrop", 0.05),  # 95M encoder_layerdrop
    ("model.dropout_input", 0.1),  # 95M dropout_input
    ("model.feature_grad_mult", 0.1),  # 95M feature_grad_mult
    ("model.final_dim", 64),  # 95M final_dim
    ("model.special_symbols", 4),  # fairseq Dictionary's 4 special symbols
    ("model.cqt_loss_weight", 1.0),  # 95M audio_cqt_loss_m true, loss_weights [10, 1]
    ("model.cqt_bins", 336),  # 95M audio_cqt_bins
    ("model.mixture_prob", 0.5),  # 95M mixture_prob
    ("model.mixture_segments", [1, 3]),  # 95M inbatch_noise_augment_number_range
    ("model.mixture_samples", [12_000, 24_000]),  # 95M inbatch_noise_augment_len_range
    ("model.mixture_volume", 1.0),  # 95M inbatch_noise_augment_volume
    ("train.crop_unit", "sample"),  # 95M random_crop
    ("train.mask_group", 16),  # require_same_masks per GPU micro-batch: 16 crops (95M max_tokens)
]


def _name(row):
    key = row[0]
    return key if isinstance(key, str) else key.__name__.lstrip("_")


def _value(cfg, key):
    return _get(cfg, key) if isinstance(key, str) else key(cfg)


def _check(cfg, key, expected):
    got = _value(cfg, key)
    if isinstance(expected, float):
        assert got == pytest.approx(expected), (key, got)
    else:
        assert got == _tuples(expected), (key, got)


@pytest.fixture(scope="module")
def paper(root):
    return C.load(root / "config" / "paper.yaml")


@pytest.fixture(scope="module")
def gpu_small(root):
    return C.load(root / "config" / "gpu-small.yaml")


@pytest.mark.parametrize("key, expected", MERT_330M, ids=[_name(r) for r in MERT_330M])
def test_paper_preset_is_mert_330m(paper, key, expected):
    _check(paper, key, expected)


@pytest.mark.parametrize("key, expected", MERT_95M, ids=[_name(r) for r in MERT_95M])
def test_gpu_small_preset_is_mert_95m(gpu_small, key, expected):
    _check(gpu_small, key, expected)


@pytest.mark.parametrize("key, expected", MODEL_SIDE_330M, ids=[_name(r) for r in MODEL_SIDE_330M])
def test_paper_preset_model_side_is_mert_330m(paper, key, expected):
    _check(paper, key, expected)


@pytest.mark.parametrize("key, expected", MODEL_SIDE_95M, ids=[_name(r) for r in MODEL_SIDE_95M])
def test_gpu_small_preset_model_side_is_mert_95m(gpu_small, key, expected):
    _check(gpu_small, key, expected)


def test_fp16_constants_are_fairseqs_defaults():
    # fairseq/dataclass/configs.py; MERT's yamls set none of fp16_init_scale, min_loss_scale, fp16_scale_window
    assert precision.INIT_SCALE == 2**7
    assert precision.MIN_LOSS_SCALE == 1e-4
    assert precision.SCALE_FACTOR == 2.0


def test_one_node_preset_is_the_paper_preset_with_the_same_batch(root, paper):
    """config/paper-1node.yaml differs from config/paper.yaml only in how the batch is spread."""
    one = C.load(root / "config" / "paper-1node.yaml")
    assert (_world(one), _crops_per_process(one), one.train.accum_steps) == (8, 7, 64)
    assert one.train.world == 8 and one.train.crops_per_update == paper.train.crops_per_update == 3_584
    assert _crops_per_update(one) == _crops_per_update(paper) == 3_584
    assert _scale_window(one) == _scale_window(paper) == 32
    spread = ("nodes", "batch_size", "accum_steps")
    train = dataclasses.replace(one.train, **{key: getattr(paper.train, key) for key in spread})
    assert dataclasses.replace(one, source=paper.source, train=train) == paper


def test_presets_have_no_duplicate_keys(root):
    """A YAML key given twice keeps the last silently: the presets must not rely on that."""

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node):
        keys = [loader.construct_object(k) for k, _ in node.value]
        assert len(keys) == len(set(keys)), keys
        return loader.construct_mapping(node)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    for name in ("paper.yaml", "paper-1node.yaml", "gpu-small.yaml"):
        yaml.load((root / "config" / name).read_text(), Loader=Strict)


def test_cost_at_merts_batch_is_the_documented_one(root):
    """benchmarks/recipe_cost.py: the numbers docs/recipe.md states for the paper preset."""
    module = load_benchmark("recipe_cost")
    paper = module.cost(C.load(root / "config" / "paper.yaml"), [0.3, 0.4], 989.0)
    assert paper["crop_frames"] == 384 and paper["crops_per_update"] == 3_584 and paper["gpus"] == 64
    assert paper["tflop_per_crop"] == pytest.approx(0.878, abs=0.001)  # "about 1 TFLOP per crop step"
    arm = paper["tflop_per_crop"] * 1e12 * 3_584 * 100_000
    assert paper["zflop_per_arm"] == pytest.approx(arm / 1e21)
    assert paper["gpu_days_per_arm"]["30%"] == pytest.approx(arm / (0.3 * 989e12) / 86_400)
    assert round(paper["gpu_days_per_arm"]["30%"], 1) == 12.3 and round(paper["gpu_days_per_arm"]["40%"], 1) == 9.2
    assert paper["gpu_days_per_figure"]["30%"] == pytest.approx(4 * paper["gpu_days_per_arm"]["30%"])
    assert paper["wall_days_per_arm"]["30%"] * 24 == pytest.approx(4.60, abs=0.01)
    doc = (root / "docs" / "recipe.md").read_text()
    assert "| 0.878 | 3,584 | 3.15 | 100,000 | 12.3 / 9.2 |" in doc
