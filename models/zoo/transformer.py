"""A small BERT-like transformer encoder with attention written out op by op.

Attention is spelled out (MatMul, Softmax, ...) rather than taken from
nn.MultiheadAttention so that the exported graph is an irregular operator graph of
the kind fine-grained planning is for, and so export never hits a fused fast path.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.seq = heads, hidden // heads, seq
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(1, self.seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.transpose(1, 2).reshape(1, self.seq, self.heads * self.head_dim))


class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, seq: int) -> None:
        super().__init__()
        self.attn = SelfAttention(hidden, heads, seq)
        self.ln1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class TransformerEncoder(nn.Module):
    """Token ids [1, seq] -> hidden states [1, seq, hidden] and a pooled vector."""

    def __init__(
        self, vocab: int = 1024, seq: int = 128, hidden: int = 256, heads: int = 4, ffn: int = 1024, layers: int = 4
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.Sequential(*[EncoderLayer(hidden, heads, ffn, seq) for _ in range(layers)])
        self.pool = nn.Linear(hidden, hidden)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.layers(self.ln(self.tok(ids) + self.pos))
        return h, torch.tanh(self.pool(h[:, 0]))


def bert_tiny() -> nn.Module:
    return TransformerEncoder(layers=4)


def bert_small() -> nn.Module:
    """Twelve layers: an irregular graph of several hundred operators."""
    return TransformerEncoder(layers=12)
