"""acoustic_mlm: reproduce MERT's acoustic-MLM training-stability figure.

Stages (one module each, one `amlm` subcommand each):
fetch -> prepare -> tokenizer -> train (x4 arms) -> aggregate -> figure.
"""

__version__ = "0.1.0"
