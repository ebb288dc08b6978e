"""The `dct` codec's reference in float64 (the textbook DCT-II matrix, not the codec's fast
transform): what the kept coefficients of each block are, and what decodes from them."""
import math

import torch


def dct_matrix(B):
    """The orthonormal DCT-II: row k is a_k cos(pi k (2n + 1) / (2B))."""
    n = torch.arange(B, dtype=torch.float64)
    k = n[:, None]
    C = torch.cos(math.pi * k * (2 * n + 1) / (2 * B))
    C[0] *= math.sqrt(1 / B)
    C[1:] *= math.sqrt(2 / B)
    return C


def blocks_of(x, B):
    n = x.numel()
    nb = -(-n // B)
    return torch.cat([x.double(), x.new_zeros(nb * B - n, dtype=torch.float64)]).view(nb, B)


def dct_topk(x, B, k):
    """(coefficients of the padded blocks, mask of the k largest per block)."""
    Y = blocks_of(x, B) @ dct_matrix(B).T
    mask = torch.zeros_like(Y, dtype=torch.bool)
    mask.scatter_(1, Y.abs().topk(k, dim=1).indices, True)
    return Y, mask


def dct_reconstruct(x, B, k):
    """What the exact kept coefficients decode to: the inverse of each sparse block."""
    Y, mask = dct_topk(x, B, k)
    return ((Y * mask) @ dct_matrix(B)).reshape(-1)[:x.numel()]
