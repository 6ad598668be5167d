"""The tokenizer stage: EnCodec codes for every clip, the targets of the masked prediction."""
