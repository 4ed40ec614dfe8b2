"""Serving-side DART tiers (000 Algorithm 1): the MaxSim and cross-encoder rerankers, on ONNX Runtime.

Both rerank the top :data:`adawidth.tiers.RERANK_DEPTH` (50) candidates of the first stage and read the
documents' encoder texts (``encoder_text.json`` of the version, title + " " + text):

* :class:`MaxSimScorer`: late interaction Σ_i max_j <q_i, d_j> over the **served encoder's** last-hidden-state
  token embeddings (L2-normalised rows, special tokens included, documents at the encoder's 256 tokens). Token
  matrices of documents are computed on demand and kept in a bounded LRU cache keyed by (version, row), so a
  document seen recently costs nothing; a cold query encodes up to 50 documents.
* :class:`CrossEncoderScorer`: the trainer's fine-tuned cross-encoder (``trainer.dart.cross_encoder``), one
  forward pass per (query, candidate) pair.

No torch here: both run on ONNX Runtime (CUDA when present). The pair tokenisation lives here too, so the
trainer and the gateway tokenise pairs with the same code.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from adawidth.tiers import maxsim, normalize_rows
from engine.encoder import onnx_session


class CrossEncoderNotFoundError(FileNotFoundError):
    """No complete cross-encoder export at the configured folder (train one with
    ``python -m trainer.dart.cross_encoder``)."""


def pair_tokenizer(tokenizer_file: Path | str, max_tokens: int):
    """A ``tokenizers`` tokenizer for (query, document) pairs: ``[CLS] q [SEP] d [SEP]`` with token types 0/1,
    truncated longest-first to ``max_tokens`` (so the document is cut first) and padded to the batch's longest."""
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.enable_truncation(max_length=max_tokens, strategy="longest_first")
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encode_pairs(tok, query: str | Sequence[str], texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Feeds for C pairs (one query for all, or one per text): ``input_ids``, ``attention_mask``,
    ``token_type_ids``, each int64 of shape (C, L)."""
    queries = [query] * len(texts) if isinstance(query, str) else list(query)
    enc = tok.encode_batch(list(zip(queries, texts)))
    return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}


def rerank_order(scores: np.ndarray) -> np.ndarray:
    """Positions sorted by ``scores`` descending; stable, so ties keep the first stage's order."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")


class CrossEncoderScorer:
    """s_CE(q, d) of an exported cross-encoder (higher is better; a logit, not a probability).

    Args:
        export_dir: folder with ``model.onnx``, ``tokenizer.json`` and ``cross_encoder.json``.
        threads: intra-op threads (0 = ONNX Runtime's default); prefer_gpu: CUDA provider when present.
        spin: let idle ONNX Runtime threads busy-wait (the gateway turns it off).

    Raises:
        CrossEncoderNotFoundError: the export is missing or incomplete.
    """

    def __init__(self, export_dir: Path | str, *, threads: int = 0, prefer_gpu: bool = True, spin: bool = True):
        export_dir = Path(export_dir)
        meta_path = export_dir / "cross_encoder.json"
        if not meta_path.is_file() or not (export_dir / "model.onnx").is_file() \
                or not (export_dir / "tokenizer.json").is_file():
            raise CrossEncoderNotFoundError(
                f"no cross-encoder export at {export_dir} (train one: python -m trainer.dart.cross_encoder)")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.max_tokens = int(self.meta["max_tokens"])
        self.tokenizer = pair_tokenizer(export_dir / "tokenizer.json", self.max_tokens)
        self.session, self.providers = onnx_session(export_dir / "model.onnx", threads, prefer_gpu, spin)

    @property
    def sha256(self) -> str:
        """Hex sha256 of the exported ``model.onnx`` (from ``cross_encoder.json``)."""
        return self.meta["onnx_sha256"]

    def score(self, query: str, texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """(C,) float32 scores of (query, text) pairs, in the order of ``texts``."""
        out = np.empty(len(texts), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")  # similar lengths share a batch
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            feeds = encode_pairs(self.tokenizer, query, [texts[i] for i in idx])
            out[idx] = self.session.run(["score"], feeds)[0].reshape(-1)
        return out


class MaxSimScorer:
    """Late interaction over the served encoder's token embeddings, with an LRU cache of document matrices.

    Args:
        encoder: a :class:`engine.encoder.OnnxEncoder` (its ``token_embeddings`` output).
        cache_documents: documents whose (L, D) float16 token matrices are kept (0 disables the cache); at 256
            tokens × 384 dimensions a document takes 192 KiB, so 2048 documents take about 384 MiB.
    """

    def __init__(self, encoder, cache_documents: int = 2048):
        self.encoder = encoder
        self.capacity = int(cache_documents)
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _tokens(self, texts: Sequence[str], batch_size: int = 16) -> list[np.ndarray]:
        out: list[np.ndarray] = [None] * len(texts)  # type: ignore[list-item]
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            for i, t in zip(idx, self.encoder.encode_tokens([texts[i] for i in idx])):
                out[i] = normalize_rows(t)
        return out

    def document_tokens(self, version: str, rows: Sequence[int], texts: Sequence[str]) -> list[np.ndarray]:
        """Unit-row token matrices (L_c, D) float32 of the documents ``rows`` (texts given in the same order)."""
        got: dict[int, np.ndarray] = {}
        with self._lock:
            for r in rows:
                m = self._cache.get((version, int(r)))
                if m is not None:
                    self._cache.move_to_end((version, int(r)))
                    got[int(r)] = m
            self.hits += len(got)
        missing = [i for i, r in enumerate(rows) if int(r) not in got]
        if missing:
            fresh = self._tokens([texts[i] for i in missing])
            with self._lock:
                self.misses += len(missing)
                for i, m in zip(missing, fresh):
                    got[int(rows[i])] = m
                    if self.capacity:
                        self._cache[(version, int(rows[i]))] = m.astype(np.float16)
                        while len(self._cache) > self.capacity:
                            self._cache.popitem(last=False)
        return [np.asarray(got[int(r)], dtype=np.float32) for r in rows]

    def score(self, query: str, version: str, rows: Sequence[int], texts: Sequence[str]) -> np.ndarray:
        """(C,) float32 MaxSim scores of the documents ``rows`` (higher is better, in [-Lq, Lq])."""
        q = self._tokens([query])[0]
        return maxsim(q, self.document_tokens(version, rows, texts))
