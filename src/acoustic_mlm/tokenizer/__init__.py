"""The tokenizer stage: EnCodec codes for every clip, the targets of the masked prediction.

codec (EnCodec built, loaded, its checkpoint downloaded) -> loudness (what its input is normalised
to) -> kmeans, calibration (the offline codebooks) -> encode (clips to aligned codes) -> stage (fit,
encode_shard, merge, run: the stage's files).
"""
