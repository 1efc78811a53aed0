"""Measurements: the speed benchmark, backbone comparisons and attention analysis
(fronted by the thin CLIs in ``scripts/``)."""
