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
            batch_size: texts per ONNX call; texts are sorted by length so a batch pads little.

        Returns:
            shape (B, D), float32, unit rows, in the order of ``texts``.
        """
        if not texts:
            return np.empty((0, self.dimension), dtype=np.float32)
        lengths = [len(t) for t in texts]
        order = np.argsort(lengths, kind="stable")[::-1]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            feeds = self.tokenize([texts[i] for i in idx])
            emb = self.session.run(["sentence_embedding"], feeds)[0]
            out[idx] = emb
        return out

    def encode_tokens(self, texts: list[str]) -> list[np.ndarray]:
        """Per-token embeddings (last hidden state) for late interaction.

        Returns a list of B arrays, each float32 of shape (L_i, D) holding only
        the unpadded tokens of text i.
        """
        feeds = self.tokenize(texts)
        hidden = self.session.run(["token_embeddings"], feeds)[0]
        return [hidden[i, : int(feeds["attention_mask"][i].sum())] for i in range(len(texts))]


def default_threads() -> int:
    """Intra-op threads for ONNX Runtime when none is configured: the machine's cores."""
    return os.cpu_count() or 1
