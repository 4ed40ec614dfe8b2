"""Build script for the compiled parts; the project's metadata lives in pyproject.toml.

``adawidth._levelscan`` is the level-by-level pruning kernel behind :mod:`adawidth.levels` (plain C11 and the
CPython buffer protocol, no numpy headers).  It picks AVX-512F or AVX2+FMA+F16C at import time on x86-64 and
falls back to portable C elsewhere, so one build runs on any x86-64 and builds on aarch64.
``adawidth._forest`` predicts a flattened LightGBM regression forest for a few rows (:mod:`adawidth.forest`).
``adawidth._effort`` chooses an ANN query's effort from its probe's answer in one call (:func:`engine.ann.probe_and_choose`).
``adawidth._hnsw`` searches a faiss HNSW graph and resumes the search at a wider beam (:class:`engine.ann.ResumableHnsw`).
``-ffp-contract=off`` keeps the portable path's float arithmetic exactly as written (no fused multiply-adds
that the SIMD paths do not also make), so a row's score does not depend on the compiler's contraction choices.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "adawidth._levelscan",
            sources=["adawidth/_levelscan.c"], depends=["adawidth/_forest_eval.h"],
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing", "-pthread"],
            extra_link_args=["-pthread"],
        ),
        Extension("adawidth._forest", sources=["adawidth/_forest.c"], depends=["adawidth/_forest_eval.h"],
                  extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing"]),
        Extension("adawidth._effort", sources=["adawidth/_effort.c"],
                  depends=["adawidth/_effort_eval.h", "adawidth/_forest_eval.h"],
                  extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-strict-aliasing"]),
        Extension("adawidth._hnsw", sources=["adawidth/_hnsw.c"],
                  depends=["adawidth/_effort_eval.h", "adawidth/_forest_eval.h"],
                  extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-strict-aliasing"]),
    ]
)
