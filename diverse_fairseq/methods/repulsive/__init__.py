"""Repulsive attention (An, Lyu, Wang, Chen, Tao, Lu, Yan. EMNLP 2020): svgd.py (Eqs. 4-5), particles.py,
particle_adam.py (Algorithm 1), precision.py, optimizer.py (--optimizer repulsive_adam)."""
