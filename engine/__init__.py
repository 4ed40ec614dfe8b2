"""engine: the runtime shared by the gateway (``service/``) and the trainer (``trainer/``).

Neither process imports the other; both import this package.  It holds everything that touches files,
ONNX Runtime, faiss, LightGBM, BM25, Redis or Milvus on behalf of both:

* :mod:`engine.io` -- I/O helpers: the one atomic-write helper (:mod:`engine.io.atomic`) and the BEIR
  loader (:mod:`engine.io.beir`);
* :mod:`engine.version` -- the index-version format in one place: the typed manifest and its one
  ``verify``, and the writers and readers of every file of a version;
* :mod:`engine.encoder` (ONNX encoder), :mod:`engine.scorers` (MaxSim and cross-encoder on ONNX Runtime),
  :mod:`engine.lexical` (BM25 runtime), :mod:`engine.stage1` (stage-1 backends), :mod:`engine.index`
  (a loaded version), :mod:`engine.registry` (the version registry), :mod:`engine.gate` (quality gate).

It never imports torch, fastapi, ``service``, ``trainer`` or ``bench`` (``tests/unit/test_layering.py``).
The maths stays in :mod:`adawidth`, which imports no file, network or clock module.
"""
