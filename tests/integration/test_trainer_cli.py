"""The trainer CLI refuses inconsistent builds with a one-line error and exit status 2, before any encoding."""

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_adapter_build_without_a_train_split_says_to_use_pca(tmp_path, encoder_dir):
    (tmp_path / "models").mkdir()
    os.symlink(encoder_dir, tmp_path / "models" / "minilm-onnx")
    env = dict(os.environ, ADAWIDTH_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "trainer", "build", "--dataset", str(ROOT / "data" / "limit-small")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rotation 'adapter' needs training qrels") and "--rotation pca" in last
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "indexes").exists() or not any((tmp_path / "indexes").rglob("manifest.json"))


def test_a_build_over_the_memory_budget_exits_2_with_the_bytes_needed(tmp_path, encoder_dir):
    (tmp_path / "models").mkdir()
    os.symlink(encoder_dir, tmp_path / "models" / "minilm-onnx")
    env = dict(os.environ, ADAWIDTH_HOME=str(tmp_path), HF_HUB_OFFLINE="1", ADAWIDTH_MEMORY_BUDGET_BYTES="1000000")
    p = subprocess.run([sys.executable, "-m", "trainer", "build", "--dataset", str(ROOT / "data" / "scifact"),
                        "--rotation", "pca", "--ann", "hnsw"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    # 5,183 documents x (4 D documents + 4 D vectors + the M = 32 graph's 272.13 bytes) per document
    need = -(-round((2 * 4 * 384 + 272.13) * 5183 * 100) // 100)
    assert last.startswith("error: the stage-1 backend does not fit the memory budget of 1,000,000 bytes")
    assert f"hnsw needs {need:,} bytes" in last and "Traceback" not in p.stderr
    assert not (tmp_path / "indexes").exists() or not any((tmp_path / "indexes").rglob("manifest.json"))
