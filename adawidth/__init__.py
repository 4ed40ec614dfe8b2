"""adawidth: the pure library behind the adaptive-width retrieval service.

Maths only: numpy (and the standard library); no file, network or clock module, no
torch, no faiss. Files, ONNX Runtime, faiss, BM25, Redis and Milvus live in :mod:`engine`,
the runtime shared by the gateway (``service/``) and the trainer (``trainer/``).

Glossary of array dimensions (used in every docstring of the project):

====  ==========================================================================
N     documents in the corpus (index rows)
Q     queries in a batch or a split
D     encoder width (384 for all-MiniLM-L6-v2)
m     a prefix width: the number of leading rotated coordinates scored
m0    the stage-1 width (default 64)
l, h  the low and high widths of a router action pair, m0 <= l < h <= D
C     shortlist size (candidates per query kept after stage 1; default 500)
c     candidates per training query drawn from its shortlist (default 32)
F     Householder reflections in the adapter (default 64)
B     a minibatch of training queries
k     the number of results returned (retrieval depth)
L     tokens in a sequence (at most the encoder's max tokens, 256)
====  ==========================================================================

Scores are inner products of unit vectors (cosines); higher is better unless a
docstring says otherwise.  Sources are cited as "Eq. (n) of 001" for
``../shared/seeds/001_63bafbdb24f0770e.txt`` (AdaWidth) and so on.
"""

__version__ = "0.1.0"
