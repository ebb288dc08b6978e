"""Builds the built-in dataset: WordNet glosses (Debian package wordnet-base) as a JSON array of
{"id", "title", "text"}, about 10 MB of English, with a held-out validation file.

    apt-get install -y wordnet-base
    python examples/make_wordnet_dataset.py --out_dir data/wordnet
"""
from __future__ import annotations

import argparse
import json
import os
import sys

WORDNET_DIR = "/usr/share/wordnet"
PARTS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def synsets(wordnet_dir: str):
    """(id, words, part of speech, gloss) of every synset, in file order."""
    for part, name in PARTS.items():
        path = os.path.join(wordnet_dir, f"data.{part}")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: install WordNet with `apt-get install -y wordnet-base`")
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(" ") or "|" not in line:
                    continue  # the licence header
                head, gloss = line.split("|", 1)
                fields = head.split()
                n_words = int(fields[3], 16)
                words = [w.replace("_", " ") for w in fields[4:4 + 2 * n_words:2]]
                yield f"{part}.{fields[0]}", words, name, gloss.strip()


def gloss_lines(words: list[str], gloss: str) -> str:
    """'word: definition.' then its examples. Glosses read 'definition; "example"; ...'."""
    parts = [p.strip() for p in gloss.split(";") if p.strip()]
    definition = "; ".join(p for p in parts if not p.startswith('"')).rstrip(".")
    examples = [p.strip('"') for p in parts if p.startswith('"')]
    examples = [e if e.endswith((".", "?", "!")) else e + "." for e in examples]
    return "\n".join([f"{words[0]}: {definition}."] + [f"  {e}" for e in examples])


def documents(wordnet_dir: str, per_doc: int):
    """Runs of per_doc consecutive synsets of one part of speech (neighbours in WordNet's files
    are related senses), as {"id", "title", "text"} with the title naming the first word."""
    run: list = []
    for s in synsets(wordnet_dir):
        if run and (len(run) == per_doc or run[0][2] != s[2]):
            yield _doc(run)
            run = []
        run.append(s)
    if run:
        yield _doc(run)


def _doc(run: list) -> dict:
    sid, words, pos, _ = run[0]
    return {"id": sid, "title": f"{words[0]} ({pos})",
            "text": "\n".join(gloss_lines(w, g) for _, w, _, g in run)}


def write_array(path: str, docs: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[\n")
        for i, d in enumerate(docs):
            f.write((",\n" if i else "") + json.dumps(d, ensure_ascii=False))
        f.write("\n]\n")
    os.replace(tmp, path)


def build(out_dir: str, wordnet_dir: str = WORDNET_DIR, val_every: int = 50,
          per_doc: int = 8) -> tuple[str, str]:
    """Writes train.json and val.json (every val_every-th document held out). Returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    train, val = [], []
    for i, d in enumerate(documents(wordnet_dir, per_doc)):
        (val if i % val_every == val_every - 1 else train).append(d)
    paths = os.path.join(out_dir, "train.json"), os.path.join(out_dir, "val.json")
    write_array(paths[0], train)
    write_array(paths[1], val)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="data/wordnet")
    p.add_argument("--wordnet_dir", default=WORDNET_DIR)
    p.add_argument("--val_every", type=int, default=50, help="hold out one document in this many")
    p.add_argument("--per_doc", type=int, default=8, help="synsets per document")
    args = p.parse_args(argv)
    try:
        paths = build(args.out_dir, args.wordnet_dir, args.val_every, args.per_doc)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
