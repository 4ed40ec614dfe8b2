"""One module per stage of a search, in order: encode, rotate, stage1, route, rescore, fuse, rerank, render.

Each module's name is the stage's name in :mod:`engine.pipeline`, in the trace's ``timings_seconds`` and in the
Prometheus ``stage`` label (``adawidth_search_stage_duration_seconds``).
"""

STAGES = ("encode", "rotate", "stage1", "route", "rescore", "fuse", "rerank", "render")
