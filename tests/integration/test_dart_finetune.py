"""CPU fine-tuning path of DART (trainer/dart/finetune.py) on the bundled MiniLM weights and real SciFact text."""

import copy
import gzip
import json

import numpy as np
import pytest
import torch

from adawidth.metrics import ranking_metric
from adawidth.tiers import oracle_tier
from engine.encoder import OnnxEncoder
from engine.io.beir import load_collection
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings
from trainer.dart.export import export_finetuned
from trainer.dart.finetune import (FinetuneConfig, FrozenStates, TopEncoder, TrainData, encode_states, load_bert,
                                   merge_into, rank, split_dev, train)
from trainer.dart.tier_rankings import tier_rankings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return load_bert()


def _full_model_embeddings(bert, tok, texts, max_tokens):
    tk = copy.deepcopy(tok)
    tk.enable_truncation(max_length=max_tokens)
    tk.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tk.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    m = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        h = bert(input_ids=ids, attention_mask=m, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    p = (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)
    return torch.nn.functional.normalize(p, dim=-1).numpy()


@pytest.mark.parametrize("t", [1, 2, 6])
def test_cached_frozen_states_plus_top_layers_equal_the_full_model(model, t):
    bert, tok = model
    texts = ["vitamin D and multiple sclerosis", "T cells in the immune response " * 30, ""]
    st = FrozenStates.compute(bert, tok, texts, frozen_layers=6 - t, max_tokens=128)
    got = encode_states(TopEncoder(bert, t), st)
    want = _full_model_embeddings(bert, tok, texts, 128)
    assert np.abs(got - want).max() < 2e-4  # float16 storage of the frozen states


def test_training_on_scifact_subset_improves_dev_and_merges(model):
    bert, tok = model
    col = load_collection("data/scifact", "train")
    qids = sorted(col.judged_queries())[:96]
    rel = sorted({d for q in qids for d, g in col.qrels[q].items() if g > 0})
    other = [d.doc_id for d in col.corpus if d.doc_id not in set(rel)][:200]
    doc_ids = rel + other
    text = {d.doc_id: d.encoder_text() for d in col.corpus}
    dst = FrozenStates.compute(bert, tok, [text[d] for d in doc_ids], frozen_layers=5, max_tokens=64)
    qst = FrozenStates.compute(bert, tok, [col.queries[q] for q in qids], frozen_layers=5, max_tokens=32)
    row = {d: i for i, d in enumerate(doc_ids)}
    tr, dev = split_dev(qids, 0.25, seed=0)
    assert split_dev(qids, 0.25, seed=0) == (tr, dev) and not set(tr) & set(dev)
    qrow = {q: i for i, q in enumerate(qids)}
    pos = [[row[d] for d, g in col.qrels[q].items() if g > 0] for q in tr]
    data = TrainData(doc_ids, np.array([qrow[q] for q in tr]), pos, np.array([len(p) for p in pos]),
                     np.array([qrow[q] for q in dev]), [col.qrels[q] for q in dev], k_max=max(map(len, pos)))
    # train on the dev queries as well, to check that the objective can fit what it sees
    cfg = FinetuneConfig(objective="at_dw_infonce", seed=0, trainable_layers=1, batch_queries=16, max_epochs=2,
                         patience=1, lr=2e-4, mine_depth=10, head_lambda=0.1)
    with pytest.raises(ValueError):  # the joint head (Eq. 2) needs oracle tiers
        train(cfg, bert, dst, qst, data)
    # oracle tiers from the frozen encoder's MIPS and MaxSim rankings (the cross-encoder tier is not used here)
    base0 = TopEncoder(bert, 1)
    X0 = encode_states(base0, dst)
    tiers = tier_rankings(base0, qst, data.train_rows, dst, X0, depth=20)
    for a, b in zip(tiers["mips"], tiers["maxsim"]):
        assert sorted(a) == sorted(b)  # MaxSim reorders the MIPS candidates
    assert any(list(a) != list(b) for a, b in zip(tiers["mips"], tiers["maxsim"]))
    qual = np.stack([ranking_metric(tiers[t], [col.qrels[q] for q in tr], "ndcg", 10, doc_ids)
                     for t in ("mips", "maxsim")], axis=1)
    data.train_tier = oracle_tier(qual)
    top, report, X = train(cfg, bert, dst, qst, data)
    assert np.allclose(X, encode_states(top, dst), atol=1e-5)
    assert report["history"][0]["epoch"] == 0 and len(report["history"]) >= 2
    assert report["steps"] > 0
    assert top.difficulty_head is None or top.difficulty_head.shape == (3, 384)
    train_loss = [h["train_loss"] for h in report["history"][1:]]
    assert all(np.isfinite(train_loss))
    # the training queries' positives rank higher after fine-tuning than before
    base = TopEncoder(bert, 1)

    def mrr(enc):
        R = rank(encode_states(enc, qst, data.train_rows), encode_states(enc, dst), len(doc_ids))
        return np.mean([1.0 / (1 + min(list(r).index(p) for p in ps)) for r, ps in zip(R, pos)])
    assert mrr(top) > mrr(base) + 0.02
    full = merge_into(bert, top)
    for a, b in zip(full.encoder.layer[5].parameters(), top.layers[0].parameters()):
        assert torch.equal(a, b)
    for a, b in zip(full.encoder.layer[0].parameters(), bert.encoder.layer[0].parameters()):
        assert torch.equal(a, b)


def _tiny_beir(folder, n_queries=40, n_docs=300):
    """A small BEIR folder cut from SciFact: n_queries train queries, their relevant documents, filler."""
    col = load_collection("data/scifact", "train")
    qids = sorted(col.judged_queries())[:n_queries]
    rel = [d for q in qids for d, g in col.qrels[q].items() if g > 0]
    keep = list(dict.fromkeys(rel + [d.doc_id for d in col.corpus]))[:n_docs]
    by_id = {d.doc_id: d for d in col.corpus}
    (folder / "qrels").mkdir(parents=True)
    with gzip.open(folder / "corpus.jsonl.gz", "wt") as f:
        for d in keep:
            f.write(json.dumps({"_id": d, "title": by_id[d].title, "text": by_id[d].text}) + "\n")
    with gzip.open(folder / "queries.jsonl.gz", "wt") as f:
        for q in qids:
            f.write(json.dumps({"_id": q, "text": col.queries[q]}) + "\n")
    with open(folder / "qrels" / "train.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for q in qids:
            for d, g in col.qrels[q].items():
                if d in keep:
                    f.write(f"{q}\t{d}\t{g}\n")
    return folder


def test_finetuned_encoder_exports_to_onnx_and_builds_a_new_version(model, tmp_path):
    """The merged model exported to ONNX encodes like torch; a build with it records the new encoder."""
    bert, tok = model
    top = TopEncoder(bert, 1)
    with torch.no_grad():  # a deterministic change of the top layer stands in for training here
        for p in top.layers[0].output.dense.parameters():
            p.mul_(1.5)
    full = merge_into(bert, top)
    out = export_finetuned(full, tmp_path / "enc", tag="test", report={"note": "unit"})
    enc = OnnxEncoder(out, threads=1, prefer_gpu=False)
    assert enc.info.model_name.endswith("+dart-test")
    texts = ["vitamin D and multiple sclerosis", "T cells in the immune response " * 60]
    want = _full_model_embeddings(full, tok, texts, 256)
    assert np.abs(enc.encode(texts) - want).max() < 1e-4
    frozen = _full_model_embeddings(bert, tok, texts, 256)
    assert np.abs(want - frozen).max() > 1e-2  # the change is visible in the embeddings

    folder = _tiny_beir(tmp_path / "tiny")
    settings = TrainerSettings(home=tmp_path / "home", encoder_dir=out, redis_url=None,
                               embedding_cache=tmp_path / "cache.sqlite").resolved()
    path, manifest = build_index(BuildOptions(dataset=folder, collection="tiny-dart", rotation="pca", eval_split=None,
                                              action_pairs=((64, 128),), default_pair=(64, 128), capacity=False,
                                              router_crossfit_folds=0), settings, enc)
    assert manifest.encoder.model_name == enc.info.model_name
    assert manifest.encoder.onnx_sha256 == enc.info.onnx_sha256
    # every document was encoded by the new encoder (cache keyed by the ONNX hash)
    docs = np.load(path / "docs.npy", mmap_mode="r")
    assert docs.shape[0] == 300
