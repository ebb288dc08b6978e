"""The small transformer the multi-process FSDP tests train: embedding, two encoder blocks (two
FSDP units of equal size, which the per-unit residual keying must tell apart), a head."""
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=64, dim=32, blocks=2, heads=4, ff=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True) for _ in range(blocks))
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)
