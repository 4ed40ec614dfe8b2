"""Query and document encoder on ONNX Runtime (CUDA when present, CPU otherwise).

Tokenisation uses the ``tokenizers`` library with the model's own
``tokenizer.json``, truncating at the export's ``max_tokens`` (256 for
all-MiniLM-L6-v2; the tokenizer file itself says 128, which sentence-transformers
overrides, and so do we) and padding each batch to its longest member.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


class EncoderNotFoundError(FileNotFoundError):
    """The ONNX export directory is missing or incomplete (run ``make encoder``)."""


@dataclass(frozen=True)
class EncoderInfo:
    """What the index manifest records about the encoder (``encoder.json`` of the export)."""

    model_name: str
    dimension: int
    max_tokens: int
    pooling: str
    normalization: str
    truncation: str
    onnx_sha256: str
    tokenizer_sha256: str

    def as_manifest(self) -> dict:
        """The manifest's ``encoder`` section: every field of ``encoder.json`` this dataclass holds."""
        return dict(self.__dict__)


def encoder_fingerprint(encoder) -> str:
    """``onnx_sha256|tokenizer_sha256|max_tokens`` of an encoder (``info`` and ``max_tokens`` attributes):
    what the embedding cache mixes into every key and what a write-ahead log record names, so vectors of
    another encoder, tokenizer or truncation are never reused."""
    return f"{encoder.info.onnx_sha256}|{encoder.info.tokenizer_sha256}|{encoder.max_tokens}"


def available_providers(prefer_gpu: bool = True) -> list[str]:
    """ONNX Runtime execution providers to use, CUDA first when present and wanted."""
    have = ort.get_available_providers()
    wanted = (["CUDAExecutionProvider"] if prefer_gpu else []) + ["CPUExecutionProvider"]
    return [p for p in wanted if p in have] or ["CPUExecutionProvider"]


def onnx_session(path: Path, threads: int = 0, prefer_gpu: bool = True, spin: bool = True):
    """An ONNX Runtime session of ``path`` and the providers it uses (CUDA first when present and wanted).

    Args:
        threads: intra-op threads (0 = ONNX Runtime's default; inter-op is then 1).
        spin: let idle intra-op threads busy-wait (fastest for bulk work; the gateway turns it off).
    """
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spin:
        # idle intra-op threads otherwise busy-wait after each call and steal the
        # cores that faiss, numpy and the HTTP server need between queries
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = available_providers(prefer_gpu)
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers), providers


class OnnxEncoder:
    """Sentence encoder over an ONNX export made by ``trainer.export_onnx``.

    Args:
        export_dir: folder with ``model.onnx``, ``tokenizer.json``, ``encoder.json``.
        threads: intra-op threads for the CPU provider (0 = ONNX Runtime's default).
        prefer_gpu: use the CUDA provider when onnxruntime-gpu and a GPU are present.
        max_tokens: override of the export's max tokens (None = the export's).
        spin: let idle ONNX Runtime threads busy-wait (fastest for bulk encoding;
            the gateway turns it off so concurrent requests keep their cores).

    Raises:
        EncoderNotFoundError: if the export is missing or incomplete.
    """

    def __init__(self, export_dir: Path | str, *, threads: int = 0, prefer_gpu: bool = True,
                 max_tokens: int | None = None, spin: bool = True):
        export_dir = Path(export_dir)
        meta_path = export_dir / "encoder.json"
        if not meta_path.is_file() or not (export_dir / "model.onnx").is_file():
            raise EncoderNotFoundError(f"no encoder export at {export_dir} (run `make encoder`)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.info = EncoderInfo(**{k: meta[k] for k in EncoderInfo.__dataclass_fields__})
        self.max_tokens = int(max_tokens or self.info.max_tokens)
        self.tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._unpadded = Tokenizer.from_file(str(export_dir / "tokenizer.json"))  # for length-bucketed batches
        self._unpadded.enable_truncation(max_length=self.max_tokens)
        self._unpadded.no_padding()
        self.session, self.providers = onnx_session(export_dir / "model.onnx", threads, prefer_gpu, spin)

    @property
    def dimension(self) -> int:
        """Encoder width D (384 for all-MiniLM-L6-v2)."""
        return self.info.dimension

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Token ids, attention mask and type ids, int64, shape (B, L) with L <= max_tokens."""
        enc = self.tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
        }

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens per text after truncation (special tokens included)."""
        return [sum(e.attention_mask) for e in self.tokenizer.encode_batch(texts)]

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Unit-norm sentence embeddings.

        Args:
            texts: B strings (empty strings allowed: the special tokens alone are encoded).
            batch_size: at most this many texts per ONNX call.  Texts are tokenised once, sorted by token count
                and cut into calls whose padding stays within :data:`PADDING_SLACK` of their real tokens (a
                call pads to its longest member, and a padded token costs as much as a real one).

        Returns:
            shape (B, D), float32, unit rows, in the order of ``texts``.
        """
        if not texts:
            return np.empty((0, self.dimension), dtype=np.float32)
        encs = self._unpadded.encode_batch(list(texts))
        lengths = np.array([len(e.ids) for e in encs])
        order = np.argsort(-lengths, kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for idx in length_buckets(lengths[order], batch_size):
            rows = order[idx]
            width = int(lengths[rows[0]])
            feeds = {name: np.zeros((len(rows), width), dtype=np.int64)
                     for name in ("input_ids", "attention_mask", "token_type_ids")}
            for j, r in enumerate(rows):
                e, n = encs[r], int(lengths[r])
                feeds["input_ids"][j, :n] = e.ids
                feeds["attention_mask"][j, :n] = 1
                feeds["token_type_ids"][j, :n] = e.type_ids
            out[rows] = self.session.run(["sentence_embedding"], feeds)[0]
        return out

    def encode_tokens(self, texts: list[str]) -> list[np.ndarray]:
        """Per-token embeddings (last hidden state) for late interaction.

        Returns a list of B arrays, each float32 of shape (L_i, D) holding only
        the unpadded tokens of text i.
        """
        feeds = self.tokenize(texts)
        hidden = self.session.run(["token_embeddings"], feeds)[0]
        return [hidden[i, : int(feeds["attention_mask"][i].sum())] for i in range(len(texts))]


PADDING_SLACK = 0.25
"""A batch of the encoder holds at most this share of padding tokens over its real ones."""


def length_buckets(sorted_lengths: np.ndarray, batch_size: int, slack: float = PADDING_SLACK) -> list[np.ndarray]:
    """Cut texts sorted by token count (longest first) into encoder calls of little padding.

    Args:
        sorted_lengths: (B,) int token counts, non-increasing.
        batch_size: at most this many texts a call, >= 1.
        slack: a call's padded tokens (its count x its longest) stay within ``(1 + slack)`` x its real tokens,
            or it holds one text.

    Returns:
        Index arrays into ``sorted_lengths``, consecutive and covering it, in order.
    """
    out, start, n = [], 0, len(sorted_lengths)
    while start < n:
        longest, total, end = int(sorted_lengths[start]), 0, start
        while end < n and end - start < batch_size:
            total_next = total + int(sorted_lengths[end])
            if end > start and longest * (end - start + 1) > (1.0 + slack) * total_next:
                break
            total, end = total_next, end + 1
        out.append(np.arange(start, end))
        start = end
    return out


def default_threads() -> int:
    """Intra-op threads for ONNX Runtime when none is configured: the machine's cores."""
    return os.cpu_count() or 1
