"""The words a verdict of the stability experiments' rules may say (report.decisive and its parts)."""

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE, MIXED = "supported", "not supported", "inconclusive", "mixed"
