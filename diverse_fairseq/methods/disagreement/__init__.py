"""Disagreement regularization (Li, Tu, Yang, Lyu, Zhang. EMNLP 2018): similarity.py (Eqs. 1-3), criterion.py."""
