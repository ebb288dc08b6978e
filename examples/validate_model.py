"""Validation loss and perplexity of a saved model (a run's final_model/<run_name>/ folder) on a data file.

    python examples/validate_model.py outputs/final_model/<run_name> data/wordnet/val.json

Given final_model/ itself, it takes the one run folder there, or lists them to choose from.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runs  # noqa: E402
import textdata  # noqa: E402


def blocks_of(data_path: str, tok, max_length: int) -> torch.Tensor:
    """The file's blocks as training's token cache cuts them (textdata.build_cache, into a
    scratch folder), so that this val_ppl and results.jsonl's, over the whole split, cover the
    same blocks."""
    with tempfile.TemporaryDirectory() as cache:
        textdata.build_cache(data_path, cache, lambda texts: tok(texts)["input_ids"],
                             tok.eos_token_id, max_length)
        ds = textdata.TokenBlocks(cache)
        return torch.stack([ds[i] for i in range(len(ds))])


def evaluate(model_dir: str, data_path: str, max_length: int, batch_size: int, max_batches: int | None) -> dict:
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    model.loss_type = "ForCausalLM"  # as gpt.make_model: the loss transformers uses anyway, unwarned
    if max_length > model.config.n_positions:
        raise ValueError(f"--max_length {max_length} exceeds the model's n_positions {model.config.n_positions}")
    blocks = blocks_of(data_path, tok, max_length)
    n_blocks = len(blocks)
    total, count = 0.0, 0
    with torch.no_grad():
        for b, start in enumerate(range(0, n_blocks, batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            x = blocks[start:start + batch_size]
            n = x.numel() - x.shape[0]
            total += model(input_ids=x, labels=x).loss.item() * n
            count += n
    loss = total / count
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 700.0)), "tokens": count}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("data_path")
    p.add_argument("--max_length", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--max_batches", type=int, default=None)
    args = p.parse_args(argv)
    try:
        model_dir, note = runs.find_model(args.model_dir)
        if note:
            print(f"validate_model.py: {note}", file=sys.stderr)
        r = evaluate(model_dir, args.data_path, args.max_length, args.batch_size, args.max_batches)
    except (textdata.DataError, ValueError, OSError) as e:
        print(f"validate_model.py: error: {e}", file=sys.stderr)
        return 1
    print(f"val_loss {r['val_loss']:.4f}  val_ppl {r['val_ppl']:.2f}  ({r['tokens']} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
