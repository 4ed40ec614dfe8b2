"""I/O helpers of the engine: atomic writes (:mod:`engine.io.atomic`) and BEIR loading (:mod:`engine.io.beir`)."""
