"""EnCodec 24 kHz's facts, stated once: every stage that cuts audio into frames or counts codes
reads them from here (Défossez et al., 2022; the `encodec` package's `encodec_model_24khz`)."""

import math

SAMPLE_RATE = 24_000  # Hz: the model's input rate; prepare resamples every clip to it
HOP = 320  # samples per frame: the product of the encoder's strides (2 x 4 x 5 x 8)
FRAME_RATE = SAMPLE_RATE // HOP  # 75 frames (and codes per codebook) per second
CODEBOOK_SIZE = 1024  # codes per RVQ codebook (encodec/model.py: bins=1024)


def codebooks(bandwidth: float) -> int:
    """Codebooks EnCodec 24 kHz uses at `bandwidth` kbps: each costs log2(1024) bits x 75 Hz =
    0.75 kbps (encodec/quantization/vq.py, get_num_quantizers_for_bandwidth), so 1.5/3/6/12/24
    kbps give 2/4/8/16/32."""
    per_codebook = math.log2(CODEBOOK_SIZE) * FRAME_RATE / 1000
    return max(1, math.floor(bandwidth / per_codebook + 1e-9))


def frames(seconds: float, sample_rate: int) -> int:
    """Whole EnCodec frames in `seconds` of audio at `sample_rate`: rounded to whole samples, then
    down to whole frames (a training crop's length; prepare rejects clips shorter than one)."""
    return int(round(seconds * sample_rate)) // HOP
