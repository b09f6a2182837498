"""The benchmark behind scripts/benchmark.py: its cases (cases.py) and its measurements (measure.py)."""
