"""The cross-encoder tier's pieces (trainer.dart.cross_encoder, engine.scorers) on hand-made inputs, and the
ONNX export's parity with torch on the real MiniLM body."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine.scorers import (CrossEncoderNotFoundError, CrossEncoderScorer, MaxSimScorer, encode_pairs, pair_tokenizer,
                            rerank_order)
from trainer.dart.cross_encoder import (CrossEncoderModel, RerankData, _groups, export_cross_encoder, score_pairs,
                                        split_holdout)
from trainer.dart.finetune import load_bert, rank
from trainer.export_onnx import package_model_dir


def _tokenizer_file():
    return package_model_dir() / "tokenizer.json"


def test_pairs_carry_query_and_document_segments_and_truncate_the_document_first():
    tok = pair_tokenizer(_tokenizer_file(), 16)
    f = encode_pairs(tok, "statins heart", ["a very long document " * 20, "short"])
    assert f["input_ids"].shape == f["attention_mask"].shape == f["token_type_ids"].shape
    assert f["input_ids"].shape[1] == 16                      # padded to the longest pair, truncated at 16
    first = f["token_type_ids"][0]
    assert first[0] == 0 and first[-1] == 1                   # [CLS] query [SEP] | document [SEP]
    plain = Tokenizer.from_file(str(_tokenizer_file()))
    plain.no_padding()
    pieces = len(plain.encode("statins heart", add_special_tokens=False).ids)
    assert (first == 0).sum() == pieces + 2                   # [CLS] statins heart [SEP]: the query is kept whole
    assert f["attention_mask"][1].sum() < 16 and f["token_type_ids"][1][f["attention_mask"][1] == 0].sum() == 0


def test_rerank_order_is_descending_and_stable_on_ties():
    assert rerank_order(np.array([0.1, 0.5, 0.5, -1.0])).tolist() == [1, 2, 0, 3]


def test_holdout_split_is_disjoint_deterministic_and_complete():
    ids = [f"q{i}" for i in range(30)]
    tr, held = split_holdout(ids, 7, seed=3)
    assert len(held) == 7 and not set(tr) & set(held) and set(tr) | set(held) == set(ids)
    assert (tr, held) == split_holdout(list(reversed(ids)), 7, seed=3)
    assert split_holdout(ids, 7, seed=4)[1] != held
    assert len(split_holdout(ids[:3], 10)[0]) == 1             # at least one query is left to train on


def test_groups_put_one_positive_first_and_never_a_positive_among_the_negatives():
    cand = {"a": np.array([5, 1, 2, 3, 4]), "b": np.array([0, 9]), "c": np.array([7])}
    data = RerankData([""] * 10, [str(i) for i in range(10)], {}, {"a": [1, 5], "b": [0], "c": [7]}, cand, {})
    groups = _groups(np.random.default_rng(0), data, ["a", "b", "c"], 4)
    by = dict(groups)
    assert set(by) == {"a", "b"}                               # c has no negative candidate: skipped
    assert by["a"][0] in (1, 5) and not set(by["a"][1:]) & {1, 5} and len(by["a"]) == 4
    assert by["b"] == [0, 9, 9, 9]                              # too few negatives: drawn with replacement


def test_bi_encoder_candidates_are_the_exact_top_depth():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    Q = rng.normal(size=(3, 8)).astype(np.float32)
    got = rank(Q, X, 5)
    want = np.argsort(-(Q @ X.T), axis=1)[:, :5]
    assert np.array_equal(got, want)


class _FakeEncoder:
    """Token embeddings: one row per character (a unit vector on the character's code modulo D)."""

    def __init__(self):
        self.calls = 0

    def encode_tokens(self, texts):
        self.calls += len(texts)
        out = []
        for t in texts:
            m = np.zeros((len(t), 4), np.float32)
            m[np.arange(len(t)), [ord(c) % 4 for c in t]] = 2.0
            out.append(m)
        return out


def test_maxsim_scorer_matches_hand_computation_and_caches_documents_per_version():
    enc = _FakeEncoder()
    ms = MaxSimScorer(enc, cache_documents=2)
    # query "ab" has rows e_1, e_2 (ord('a') = 97 -> 1, 'b' -> 2); "a" matches one of them, "ab" both
    s = ms.score("ab", "v1", [0, 1, 2], ["a", "ab", "cc"])
    assert s.tolist() == [1.0, 2.0, 0.0]
    assert enc.calls == 1 + 3
    ms.score("ab", "v1", [1, 2], ["ab", "cc"])                  # both cached (capacity 2 kept rows 1 and 2)
    assert enc.calls == 1 + 3 + 1 and ms.hits == 2
    ms.score("ab", "v2", [1], ["ab"])                           # another version: not the same document
    assert enc.calls == 1 + 3 + 1 + 2


def test_a_missing_cross_encoder_export_is_a_clear_error(tmp_path):
    with pytest.raises(CrossEncoderNotFoundError, match="trainer.dart.cross_encoder"):
        CrossEncoderScorer(tmp_path)


def test_the_onnx_export_scores_like_torch(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    bert, _ = load_bert()
    model = CrossEncoderModel(bert).eval()
    export_cross_encoder(model, _tokenizer_file(), tmp_path / "ce", max_tokens=64, report={},
                         holdout_query_ids=["h"], train_query_ids=["t"], dataset="unit")
    scorer = CrossEncoderScorer(tmp_path / "ce", threads=1)
    assert scorer.meta["train_query_ids"] == ["t"] and scorer.meta["holdout_query_ids"] == ["h"]
    texts = ["Statins lower LDL cholesterol.", "The weather was cold.", "x " * 200]
    want = score_pairs(model, pair_tokenizer(_tokenizer_file(), 64), "do statins lower cholesterol", texts)
    got = scorer.score("do statins lower cholesterol", texts, batch_size=2)
    assert np.allclose(got, want, atol=1e-4)
