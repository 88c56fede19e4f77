"""dpkit.JsonlDataset against Python's own reading of the same files."""
import json
import os
import pickle

import pytest
import torch

import dpkit


def python_lines(path):
    """Python's reference: split on b'\\n', drop the empty piece after a final
    newline, strip one trailing '\\r' (as dpkit documents)."""
    data = open(path, "rb").read()
    if not data:
        return []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return [l[:-1] if l.endswith(b"\r") else l for l in lines]


@pytest.mark.parametrize("content", [
    b'{"a": 1}\n{"a": 2}\n',
    b'{"a": 1}\n\n{"a": 3}',            # empty line, no trailing newline
    b'\n\n\n',                           # only empty lines
    b'{"x": "crlf"}\r\n{"x": 2}\r\n',    # CRLF
    b'{"only": true}',                   # one line, no newline
    b'',                                 # empty file
])
def test_lines_equal_python(tmp_path, content):
    p = tmp_path / "f.jsonl"
    p.write_bytes(content)
    ds = dpkit.JsonlDataset(p, decode="bytes")
    ref = python_lines(p)
    assert len(ds) == len(ref)
    assert [ds[i] for i in range(len(ds))] == ref
    if ref:
        assert ds[-1] == ref[-1]
        assert ds.__getitems__(list(range(len(ref)))[::-1]) == ref[::-1]
    with pytest.raises(IndexError):
        ds[len(ref)]


def test_real_corpus(corpus):
    ds = dpkit.JsonlDataset(corpus, length_field="num_tokens")
    ref = python_lines(corpus)
    assert len(ds) == len(ref) == 63956
    for i in list(range(0, len(ref), 997)) + [len(ref) - 1]:
        obj = json.loads(ref[i])
        assert ds[i] == obj
        assert ds.length(i) == obj["num_tokens"]
    lengths = ds.lengths()
    assert len(lengths) == len(ref)
    assert lengths[12345] == json.loads(ref[12345])["num_tokens"]
    assert os.path.exists(str(corpus) + ".idx")


def test_index_reused_and_stale(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    dpkit.JsonlDataset(p)
    idx = str(p) + ".idx"
    st = os.stat(idx)
    dpkit.JsonlDataset(p)  # reused, not rewritten
    assert os.stat(idx).st_ino == st.st_ino and os.stat(idx).st_mtime_ns == st.st_mtime_ns
    with open(p, "ab") as f:
        f.write(b'{"a": 3}\n')
    with pytest.raises(dpkit.StaleIndexError, match="f.jsonl"):
        dpkit.JsonlDataset(p, build=False)
    ds = dpkit.JsonlDataset(p)  # rebuilt
    assert len(ds) == 3 and ds[2] == {"a": 3}


def test_damaged_index_is_an_exception_not_a_crash(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"".join(b'{"i": %d}\n' % i for i in range(1000)))
    dpkit.JsonlDataset(p)
    idx = str(p) + ".idx"
    data = bytearray(open(idx, "rb").read())
    data[200] ^= 0xFF  # inside the offsets
    open(idx, "wb").write(bytes(data))
    with pytest.raises(dpkit.FormatError, match="checksum"):
        dpkit.JsonlDataset(p)
    with open(idx, "r+b") as f:
        f.truncate(17)
    with pytest.raises(dpkit.FormatError):
        dpkit.JsonlDataset(p, build=False)


def test_bad_path_and_bad_field(tmp_path):
    with pytest.raises(dpkit.Error, match="No such file"):
        dpkit.JsonlDataset(tmp_path / "missing.jsonl")
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"n": 1}\n{"n": "two"}\n')
    with pytest.raises(dpkit.FormatError, match="line 2"):
        dpkit.JsonlDataset(p, length_field="n")
    assert not os.path.exists(str(p) + ".idx")  # never a half-written index
    with pytest.raises(ValueError):
        dpkit.JsonlDataset(p, decode="yaml")


def test_progress_bar_and_interrupt(tmp_path, capfd):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"i": 1}\n' * 200000)
    dpkit.JsonlDataset(p, progress=True)
    assert "dpkit index f.jsonl" in capfd.readouterr().err

    os.remove(str(p) + ".idx")

    def boom(shard, done, total):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        dpkit._core.JsonlIndex([str(p)], None, None, True, 0, True, boom)
    assert not os.path.exists(str(p) + ".idx")


def test_pickle_reopens_without_rebuild(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"i": 0}\n{"i": 1}\n')
    ds = dpkit.JsonlDataset(p)
    ds2 = pickle.loads(pickle.dumps(ds))
    assert [ds2[i] for i in range(2)] == [{"i": 0}, {"i": 1}]


def ids_of(batch):
    return [x["i"] for x in batch]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(tmp_path, context):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"".join(b'{"i": %d, "t": "%s"}\n' % (i, b"x" * (i % 17)) for i in range(3000)))
    ds = dpkit.JsonlDataset(p)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=context,
                                         collate_fn=ids_of)
    seen = [i for batch in loader for i in batch]
    assert seen == list(range(3000))


def test_shards(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b'{"s": "a0"}\n{"s": "a1"}\n')
    b.write_bytes(b'{"s": "b0"}\n')
    ds = dpkit.JsonlDataset([a, b])
    assert [ds[i]["s"] for i in range(len(ds))] == ["a0", "a1", "b0"]
    with pytest.raises(ValueError):
        dpkit.JsonlDataset([a, b], index_path=tmp_path / "x.idx")
