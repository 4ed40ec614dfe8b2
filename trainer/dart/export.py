"""Export a DART-fine-tuned encoder to ONNX (same graph and outputs as the frozen export) and build an index with it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from engine.io import atomic
from trainer.export_onnx import MODEL_NAME, export_encoder, package_model_dir


def export_finetuned(full_model, out_dir: Path | str, *, tag: str, report: dict | None = None) -> Path:
    """Write ``full_model`` (a transformers BertModel, e.g. :func:`trainer.dart.finetune.merge_into`) as an ONNX
    export in ``out_dir`` (``model.onnx``, ``tokenizer.json``, ``encoder.json``; overwritten if present).

    ``encoder.json`` names the model ``<all-MiniLM-L6-v2>+dart-<tag>`` so a manifest built with it records that
    the encoder changed (its ONNX sha256 differs too, so the embedding cache re-encodes the whole corpus);
    ``report`` (the training report) is stored beside it as ``dart_report.json``.
    """
    out_dir = Path(out_dir)
    src = package_model_dir()
    with tempfile.TemporaryDirectory(prefix="dart-model-") as tmp:
        full_model.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            if (src / name).is_file():
                shutil.copy2(src / name, Path(tmp) / name)
        export_encoder(out_dir, force=True, model_dir=tmp, model_name=f"{MODEL_NAME}+dart-{tag}",
                       extra_meta={"finetuned_from": MODEL_NAME, "finetune": "trainer.dart"})
    if report is not None:
        atomic.write_json(out_dir / "dart_report.json", report, indent=2, sort_keys=False, default=str)
    return out_dir
