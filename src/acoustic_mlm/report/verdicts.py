"""The words a verdict of the stability experiments' rules may say, and the fewest seeds per arm a
comparison needs to have a spread to judge by (report.decisive and its page, report.decisive_markdown)."""

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, MIXED = "supported", "not supported", "inconclusive", "mixed"
MIN_SEEDS = 2  # seeds per arm below which a comparison has no spread to judge a gap by
