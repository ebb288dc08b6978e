"""Training text in, fixed-length token blocks out: streamed readers for a JSON array of
{"id", "title", "text"}, JSON lines and plain text, and a resumable pre-tokenised shard cache."""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Callable, Iterator

import ijson
import numpy as np
import torch

FORMATS = (".json", ".jsonl", ".txt")
META = "meta.json"
SHARD_DOCS = 2000  # documents per shard: the unit an interrupted build resumes from


class DataError(ValueError):
    """Bad training data: the message names the file and what is wrong."""


def _doc_text(obj, where: str) -> str:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected an object with 'title' and 'text', got {type(obj).__name__}")
    for key in ("title", "text"):
        if key not in obj:
            raise DataError(f"{where}: missing field '{key}'")
        if not isinstance(obj[key], str):
            raise DataError(f"{where}: field '{key}' must be a string, got {type(obj[key]).__name__}")
    return obj["title"] + "\n" + obj["text"]


def _json_array(path: str) -> Iterator[str]:
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
        if not head:
            raise DataError(f"{path}: the file is empty")
        if not head.startswith(b"["):
            raise DataError(f"{path}: expected a JSON array of {{\"id\", \"title\", \"text\"}} objects")
        f.seek(0)
        n = 0
        try:
            for n, obj in enumerate(ijson.items(f, "item"), 1):
                yield _doc_text(obj, f"{path}: item {n}")
        except ijson.JSONError as e:
            raise DataError(f"{path}: malformed JSON after item {n}: {e}") from None
        if n == 0:
            raise DataError(f"{path}: the JSON array holds no documents")


def _json_lines(path: str) -> Iterator[str]:
    n = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {lineno} is not valid JSON ({e.msg})") from None
            n += 1
            yield _doc_text(obj, f"{path}: line {lineno}")
    if n == 0:
        raise DataError(f"{path}: the file is empty")


def _plain_text(path: str) -> Iterator[str]:
    """Paragraphs (blank-line separated) are the documents."""
    n, para = 0, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                para.append(line.rstrip("\n"))
            elif para:
                n += 1
                yield "\n".join(para)
                para = []
    if para:
        n += 1
        yield "\n".join(para)
    if n == 0:
        raise DataError(f"{path}: the file is empty")


def iter_documents(path: str) -> Iterator[str]:
    """Streams the documents of a .json (array), .jsonl or .txt file, never loading it whole."""
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise DataError(f"{path}: not a regular file")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".json":
        return _json_array(path)
    if ext == ".jsonl":
        return _json_lines(path)
    if ext == ".txt":
        return _plain_text(path)
    raise DataError(f"{path}: unknown data format '{ext}', expected one of {', '.join(FORMATS)}")


def file_fingerprint(path: str) -> str:
    """Identifies a data file's version without reading it all: size, mtime and the first MiB."""
    st = os.stat(path)
    h = hashlib.sha256(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _write_json_atomic(path: str, obj) -> None:
    """The meta file is replaced in one rename: a reader sees the old or the new, never half."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(cache_dir: str) -> dict | None:
    try:
        with open(os.path.join(cache_dir, META), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def cache_dir_for(cache_root: str, data_path: str, tokenizer_id: str, max_length: int,
                  part: str | None = None) -> str:
    """One cache per (data file version, tokenizer, max_length, part): `part` names a split of
    the file ("train-5%" / "val-5%" for a held-out split), None the whole file."""
    key = hashlib.sha256(f"{file_fingerprint(data_path)}|{tokenizer_id}|{max_length}|{part or ''}".encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(data_path))[0] + (f"-{part}" if part else "")
    return os.path.join(cache_root, f"{stem}-L{max_length}-{key}")


def held_out(text: str, fraction: float) -> bool:
    """Whether a document belongs to the validation split that holds out `fraction` of a file:
    a hash of its text below the fraction. The same on every run, rank and machine, whatever the
    documents' order, and a document repeated in the file lands on one side only."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
    return h < fraction * 2.0 ** 64


def split_part(fraction: float, side: str) -> str:
    """The cache `part` name of one side ("train" / "val") of a held-out split."""
    return f"{side}-{fraction:.6g}"


def build_cache(data_path: str, cache_dir: str, encode: Callable[[list[str]], list[list[int]]],
                eos_id: int, max_length: int, *, shard_docs: int = SHARD_DOCS,
                on_shard: Callable[[int], None] | None = None,
                keep: Callable[[str], bool] | None = None) -> dict:
    """Tokenises the file into shards of max_length-token blocks (documents joined by EOS, the
    tail of each shard dropped), resuming after the last finished shard. The meta file
    (processed_samples: documents of the file read, shards, finalized) is rewritten atomically
    after each shard, so a killed build leaves a consistent, unfinished cache. on_shard(i) runs
    after shard i is recorded (tests use it to interrupt). keep(text): only the documents it
    accepts go into the cache (one side of a held-out split); `kept_samples` counts them."""
    os.makedirs(cache_dir, exist_ok=True)
    meta = read_meta(cache_dir)
    if meta is not None and meta.get("finalized"):
        return meta
    if meta is None or meta.get("shard_docs") != shard_docs or meta.get("max_length") != max_length:
        meta = {"data_path": os.path.abspath(data_path), "max_length": max_length, "shard_docs": shard_docs,
                "processed_samples": 0, "kept_samples": 0, "shards": [], "num_blocks": 0, "finalized": False}
        _write_json_atomic(os.path.join(cache_dir, META), meta)
    skip = meta["processed_samples"]
    docs = iter_documents(data_path)
    batch: list[str] = []
    seen = 0

    def flush() -> None:
        tokens: list[int] = []
        for ids in encode(batch):
            tokens.extend(ids)
            tokens.append(eos_id)
        n_blocks = len(tokens) // max_length
        arr = np.asarray(tokens[: n_blocks * max_length], dtype=np.int32).reshape(n_blocks, max_length)
        name = f"shard_{len(meta['shards']):05d}.npy"
        tmp = os.path.join(cache_dir, name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, os.path.join(cache_dir, name))
        meta["shards"].append({"file": name, "blocks": int(n_blocks)})
        meta["num_blocks"] += int(n_blocks)
        meta["processed_samples"] = seen  # documents read, kept or not: where a resume starts
        meta["kept_samples"] = meta.get("kept_samples", 0) + len(batch)
        _write_json_atomic(os.path.join(cache_dir, META), meta)
        if on_shard is not None:
            on_shard(len(meta["shards"]) - 1)

    for text in docs:
        seen += 1
        if seen <= skip or (keep is not None and not keep(text)):
            continue
        batch.append(text)
        if len(batch) == shard_docs:
            flush()
            batch = []
    if seen < skip:
        raise DataError(f"{data_path}: holds {seen} documents but the cache in {cache_dir} already "
                        f"processed {skip}: the file changed under the cache")
    if batch:
        flush()
    if meta["num_blocks"] == 0:
        raise DataError(f"{data_path}: too little text for one block of {max_length} tokens")
    meta["finalized"] = True
    _write_json_atomic(os.path.join(cache_dir, META), meta)
    return meta


def wait_finalized(cache_dir: str, timeout_s: float = 3600.0, poll_s: float = 0.5) -> dict:
    """Ranks other than 0 wait here until rank 0 has finished the cache."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = read_meta(cache_dir)
        if meta is not None and meta.get("finalized"):
            return meta
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cache_dir}: the token cache was not finalized within {timeout_s:.0f} s")
        time.sleep(poll_s)


class TokenBlocks(torch.utils.data.Dataset):
    """The blocks of a finished cache, memory-mapped."""

    def __init__(self, cache_dir: str):
        meta = read_meta(cache_dir)
        if meta is None:
            raise DataError(f"{cache_dir}: no token cache here (no {META})")
        if not meta.get("finalized"):
            raise DataError(f"{cache_dir}: the token cache is unfinished ({meta.get('processed_samples')} "
                            "documents processed); rebuild it to resume")
        self.meta = meta
        self.shards = [np.load(os.path.join(cache_dir, s["file"]), mmap_mode="r") for s in meta["shards"]]
        self.offsets = np.cumsum([0] + [len(s) for s in self.shards])
        if int(self.offsets[-1]) != meta["num_blocks"]:
            raise DataError(f"{cache_dir}: shards hold {int(self.offsets[-1])} blocks, meta says {meta['num_blocks']}")

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < len(self):
            raise IndexError(i)
        s = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return torch.from_numpy(np.array(self.shards[s][i - self.offsets[s]], dtype=np.int64))


class StepSampler:
    """Which blocks each rank reads at each step: a seeded permutation per epoch, so the data
    position is just the step number (what a checkpoint stores to resume exactly)."""

    def __init__(self, n_blocks: int, batch_size: int, world: int, rank: int, seed: int):
        if n_blocks < batch_size * world:
            raise DataError(f"{n_blocks} blocks are fewer than one step needs "
                            f"(batch_size {batch_size} x {world} ranks)")
        self.n, self.b, self.w, self.r, self.seed = n_blocks, batch_size, world, rank, seed
        self.per_epoch = n_blocks // (batch_size * world)
        self._epoch, self._perm = -1, None

    def indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
            self._perm, self._epoch = torch.randperm(self.n, generator=g).tolist(), epoch
        start = (k * self.w + self.r) * self.b
        return self._perm[start:start + self.b]
