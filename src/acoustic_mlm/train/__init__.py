"""Training: the loop, the update, precision, data crops and noise, states, processes, diagnostics, loggers."""
