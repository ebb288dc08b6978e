"""The training data path: streamed readers with clear errors on bad input, and the token cache
that resumes after an interruption and is never taken for finished while partial."""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import train_utils  # noqa: F401  (puts examples/ on sys.path)
import textdata
from textdata import DataError, TokenBlocks, build_cache, iter_documents, read_meta


def _docs(gen, n):
    """Real-looking, varied documents from the seeded generator."""
    words = ["gradient", "shard", "rank", "token", "block", "scale", "residual", "error", "byte", "wire"]
    out = []
    for i in range(n):
        idx = gen.integers(0, len(words), size=int(gen.integers(5, 40)))
        out.append({"id": str(i), "title": f"doc {i}", "text": " ".join(words[j] for j in idx)})
    return out


@pytest.fixture
def rng(gen):
    return np.random.default_rng(int(gen.initial_seed()))


def _byte_encode(texts):
    return [list(t.encode("utf-8")) for t in texts]


def test_formats_read_the_same_documents(tmp_path, rng):
    docs = _docs(rng, 30)
    arr, jl, txt = tmp_path / "a.json", tmp_path / "a.jsonl", tmp_path / "a.txt"
    arr.write_text(json.dumps(docs))
    jl.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    txt.write_text("\n\n".join(d["title"] + "\n" + d["text"] for d in docs) + "\n")
    want = [d["title"] + "\n" + d["text"] for d in docs]
    assert list(iter_documents(str(arr))) == want
    assert list(iter_documents(str(jl))) == want
    assert list(iter_documents(str(txt))) == want


@pytest.mark.parametrize("name,content,message", [
    ("trunc.json", '[{"id": "1", "title": "a", "text": "b"}, {"id": "2", "title": "c", "te', "malformed JSON"),
    ("nofield.json", '[{"id": "1", "title": "a"}]', "item 1: missing field 'text'"),
    ("wrongtype.json", '[{"id": "1", "title": "a", "text": 5}]', "field 'text' must be a string"),
    ("notarray.json", '{"id": "1", "title": "a", "text": "b"}', "expected a JSON array"),
    ("emptyarr.json", "[]", "holds no documents"),
    ("empty.json", "", "the file is empty"),
    ("empty.jsonl", "\n\n", "the file is empty"),
    ("badline.jsonl", '{"title": "a", "text": "b"}\n{"title": oops}\n', "line 2 is not valid JSON"),
    ("empty.txt", "", "the file is empty"),
    ("data.csv", "a,b\n", "unknown data format '.csv'"),
])
def test_bad_input_names_file_and_problem(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as e:
        list(iter_documents(str(path)))
    assert str(path) in str(e.value) and message in str(e.value)


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        iter_documents(str(tmp_path / "absent.json"))
    with pytest.raises(DataError, match="not a regular file"):
        iter_documents(str(tmp_path))


class Interrupt(Exception):
    pass


def test_cache_resumes_after_interruption(tmp_path, rng):
    data = tmp_path / "d.json"
    data.write_text(json.dumps(_docs(rng, 95)))
    partial, fresh = str(tmp_path / "partial"), str(tmp_path / "fresh")

    def stop_after_two(i):
        if i == 1:
            raise Interrupt()

    with pytest.raises(Interrupt):
        build_cache(str(data), partial, _byte_encode, 256, 16, shard_docs=20, on_shard=stop_after_two)
    meta = read_meta(partial)
    assert meta["finalized"] is False and meta["processed_samples"] == 40 and len(meta["shards"]) == 2
    with pytest.raises(DataError, match="unfinished"):
        TokenBlocks(partial)

    encoded = []

    def counting(texts):
        encoded.extend(texts)
        return _byte_encode(texts)

    meta = build_cache(str(data), partial, counting, 256, 16, shard_docs=20)
    assert len(encoded) == 95 - 40  # only what was left
    assert meta["finalized"] and meta["processed_samples"] == 95 and len(meta["shards"]) == 5
    build_cache(str(data), fresh, _byte_encode, 256, 16, shard_docs=20)
    a, b = TokenBlocks(partial), TokenBlocks(fresh)
    assert len(a) == len(b) == meta["num_blocks"] > 0
    assert all(bool((a[i] == b[i]).all()) for i in range(len(a)))
    # Blocks are the documents' bytes joined by EOS, in order.
    first = "".join(d["title"] + "\n" + d["text"] + "\x00" for d in json.loads(data.read_text())[:3])
    got = bytes(int(t) if t != 256 else 0 for t in a[0].tolist())
    assert got == first.encode()[:16]
    # A finished cache is reused as is.
    assert build_cache(str(data), partial, counting, 256, 16, shard_docs=20) == meta and len(encoded) == 55


def test_cache_key_changes_with_tokenizer_and_length(tmp_path, rng):
    data = tmp_path / "d.jsonl"
    data.write_text("\n".join(json.dumps(d) for d in _docs(rng, 5)))
    a = textdata.cache_dir_for(str(tmp_path), str(data), "tokA", 64)
    assert a == textdata.cache_dir_for(str(tmp_path), str(data), "tokA", 64)
    assert a != textdata.cache_dir_for(str(tmp_path), str(data), "tokB", 64)
    assert a != textdata.cache_dir_for(str(tmp_path), str(data), "tokA", 128)


def test_too_little_text(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text(json.dumps({"id": "1", "title": "t", "text": "short"}) + "\n")
    with pytest.raises(DataError, match="too little text"):
        build_cache(str(data), str(tmp_path / "c"), _byte_encode, 256, 1024)
    assert read_meta(str(tmp_path / "c"))["finalized"] is False


def test_step_sampler_partitions_ranks(tmp_path):
    samplers = [textdata.StepSampler(100, 4, 3, r, seed=7) for r in range(3)]
    for step in (0, 1, 7, 8, 9):  # 8 steps per epoch: crosses into the next one
        idx = [i for s in samplers for i in s.indices(step)]
        assert len(idx) == len(set(idx)) == 12
    assert samplers[0].indices(0) != samplers[0].indices(8)
    with pytest.raises(DataError, match="fewer than one step"):
        textdata.StepSampler(10, 4, 3, 0, seed=0)
