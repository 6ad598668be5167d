"""flops.py: each part's count worked out by hand on a tiny model, and the 6nab convention against
torch.utils.flop_counter on a matmul and a conv stack. The whole model against the flop counter is
tests/benchmarks/test_train_throughput.py."""

import warnings

import pytest
import torch
import torch.nn as nn
from helpers import tiny_config
from torch.utils.flop_counter import FlopCounterMode

from acoustic_mlm.preflight import flops as F

# dim 32, 2 layers, ffn 64, positional conv kernel 4 in 4 groups, 2 codebooks of 32 codes, final_dim 16;
# a two-layer front end: (4 channels, kernel 10, stride 5), (6 channels, kernel 3, stride 2)
TINY = tiny_config(conv_layers=((4, 10, 5), (6, 3, 2)))
B, T = 2, 3


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_a_matmul_costs_2nab_forward_and_4nab_backward_as_the_flop_counter_counts():
    n, a, b = 30, 8, 32
    linear, x = nn.Linear(a, b, bias=False), torch.randn(n, a, requires_grad=True)
    assert _counted(lambda: linear(x).sum().backward()) == 6 * n * a * b == 46_080
    x = torch.randn(n, a)  # an input without a gradient: the weight's gradient only
    assert _counted(lambda: linear(x).sum().backward()) == 4 * n * a * b


def test_projection_is_one_matmul_per_frame():
    # conv channels 6 -> width 32 on 2 x 3 frames: 6 x 6 x 32 x 6
    assert F.projection_flops(TINY, B, T) == 6 * 6 * 32 * 6 == 6_912


def test_conv_front_end_by_hand_and_by_the_flop_counter():
    # Walked back from 3 frames: layer 2 reads (3 - 1) x 2 + 3 = 7 frames of layer 1, which reads
    # (7 - 1) x 5 + 10 = 40 samples. Forward: 2 c_in c_out k t_out B per layer.
    first = 2 * 1 * 4 * 10 * 7 * B  # 1,120; the waveform needs no gradient: 2x forward in all
    second = 2 * 4 * 6 * 3 * 3 * B  # 864; input and weight gradients: 3x forward in all
    assert F.conv_frontend_flops(TINY, B, T) == 2 * first + 3 * second == 4_832
    stack = nn.Sequential(nn.Conv1d(1, 4, 10, 5, bias=False), nn.Conv1d(4, 6, 3, 2, bias=False))
    wav = torch.randn(B, 1, 40)
    assert stack(wav).shape == (B, 6, T)
    assert _counted(lambda: stack(wav).sum().backward()) == 4_832


def test_blocks_are_six_times_params_times_tokens_plus_attention():
    params = 4 * 32 * 32 + 2 * 32 * 64  # q, k, v, out; fc1, fc2: 8,192
    attention = 12 * T * T * 32 * B  # Q K^T and P V, forward and backward: 6,912
    assert F.blocks_flops(TINY, B, T) == 2 * (6 * params * B * T + attention) == 603_648


def test_an_even_positional_kernel_counts_one_frame_more():
    # 32 channels in 4 groups: 8 inputs per output, kernel 4, T + 1 output frames (the last dropped)
    assert F.pos_conv_flops(TINY, B, T) == 6 * 8 * 32 * 4 * (T + 1) * B == 49_152
    odd = tiny_config(pos_conv_kernel=3)
    assert F.pos_conv_flops(odd, B, T) == 6 * 8 * 32 * 3 * T * B


def test_heads_score_every_frame_against_every_codeword():
    # per codebook: proj_k 32 -> 16, then 16-dim cosine against 32 codewords
    assert F.heads_flops(TINY, B, T) == 6 * B * T * 2 * 16 * (32 + 32) == 73_728


def test_step_is_the_sum_of_its_parts_and_the_transformer_scope_two_of_them():
    parts = 4_832 + 6_912 + 49_152 + 603_648 + 73_728
    assert F.step_flops(TINY, B, T) == parts == 738_272
    assert F.step_flops(TINY, B, T, scope="transformer") == 49_152 + 603_648
    assert F.step_flops(TINY, 2 * B, T) == 2 * parts  # linear in the crops
    with pytest.raises(ValueError, match="scope must be 'step' or 'transformer'"):
        F.step_flops(TINY, B, T, scope="model")


def test_encodec_encode_counts_3_1_gflop_per_audio_second_and_its_lstm_as_torch_decomposes_it():
    from encodec import EncodecModel

    counted = F.encodec_flops_per_second(6.0)
    assert counted == pytest.approx(3.1368192e9)
    # on the meta device torch decomposes the LSTM into matmuls, which its counter sees: the same total
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = EncodecModel.encodec_model_24khz(pretrained=False)
        model.set_target_bandwidth(6.0)
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            model.encode(torch.zeros(1, 1, 24000))
    assert fc.get_total_flops() == counted
