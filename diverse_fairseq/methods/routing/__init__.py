"""Routing-by-agreement aggregation (Li, Yang, Dou, Wang, Lyu, Tu. NAACL 2019): algorithms.py (Alg. 1-2), fast.py,
aggregation.py (Eqs. 5-7), options.py (--routing-*)."""
