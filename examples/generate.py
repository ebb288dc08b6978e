"""Prompt in, continuation out, from a saved model (a run's final_model/<run_name>/ folder).

    python examples/generate.py outputs/final_model/<run_name> "gradient: "

Given final_model/ itself, it takes the one run folder there, or lists them to choose from.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runs  # noqa: E402


def generate(model_dir: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
    import torch
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    if ids.numel() == 0:
        raise ValueError("the prompt is empty")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                             top_k=top_k if temperature > 0 else None, pad_token_id=tok.eos_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("prompt")
    p.add_argument("--max_new_tokens", type=int, default=60)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        model_dir, note = runs.find_model(args.model_dir)
        if note:
            print(f"generate.py: {note}", file=sys.stderr)
        text = generate(model_dir, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    except (ValueError, OSError) as e:
        print(f"generate.py: error: {e}", file=sys.stderr)
        return 1
    print(args.prompt + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
