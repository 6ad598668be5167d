"""acoustic_mlm: reproduce MERT's acoustic-MLM training-stability figure.

The pipeline's stages, one `amlm` subcommand each (acoustic_mlm.cli; docs/pipeline.md):
fetch -> prepare -> tokenize -> train (each arm) -> aggregate -> figure, stability, claims, compare;
with a sweep: train (each point) -> map -> map-figure, map-claims.
Around them: preflight, status, verify, validate, dvc-yaml.
"""

__version__ = "0.1.0"
