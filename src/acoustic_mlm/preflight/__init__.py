"""Preflight: counted FLOPs, measured steps, and the projected time, memory and cost of a preset."""
