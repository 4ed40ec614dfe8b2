"""The benchmarks, run as modules from the repository root: ``python -m bench.<name> [args]``.

Each writes its results under ``bench/results/`` as JSON plus a Markdown table, with the command that made
them; shared helpers are :mod:`bench.common` (results, commands) and :mod:`bench.funnels` (the funnel
benchmarks' data and statistics).
"""
