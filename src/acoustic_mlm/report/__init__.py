"""Reporting: curves and their statistics, the figure, the claims, the stability views and the reference run."""
