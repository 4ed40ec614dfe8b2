"""DART (000 §4): capacity-aware fine-tuning objectives, CPU-sized encoder fine-tuning, benchmark support.

``losses`` is pure torch (no I/O); ``finetune`` does the data and model work at its edges.
"""
