"""Paper tables as data: a YAML description per table, one runner that trains, evaluates and reports.

``python -m diverse_fairseq.tables TABLE --dataset D --scale demo|paper`` (``make table-...``, ``make demo``).
``spec`` parses and validates the descriptions, ``runner`` trains and evaluates the rows (``steps``; resuming finished
work), ``report`` writes the markdown and JSON results.
"""
