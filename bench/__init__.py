"""Benchmarks that prove Effectgate's claims with figures: ``make chaos``, ``make bench``."""
