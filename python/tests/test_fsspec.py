"""`shingle://` URLs through fsspec and pandas."""

import json
import os
import subprocess
import sys

import fsspec
import pandas as pd


def opts(cluster):
    return {"cluster_file": cluster["cluster_file"], "secret_file": cluster["secret_file"]}


def test_the_entry_point_registers_the_protocol(cluster):
    # A fresh interpreter that never imported shingle finds the filesystem by name.
    code = "import fsspec; c = fsspec.get_filesystem_class('shingle'); print(c.__module__ + '.' + c.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "shingle.fsspec.ShingleFileSystem"


def test_fsspec_filesystem_operations(cluster, client):
    fs = fsspec.filesystem("shingle", **opts(cluster))
    fs.makedirs("shingle:///fss/a", exist_ok=True)
    fs.pipe_file("shingle:///fss/a/x.json", json.dumps({"k": 1}).encode())
    with fsspec.open("shingle:///fss/a/y.bin", "wb", **opts(cluster)) as f:
        f.write(b"0123456789")
    assert fs.cat_file("/fss/a/y.bin", start=2, end=5) == b"234"
    assert fs.cat_file("shingle://fss/a/y.bin", start=-3) == b"789"
    assert json.loads(fs.cat("shingle:///fss/a/x.json")) == {"k": 1}
    assert sorted(fs.ls("/fss/a", detail=False)) == ["/fss/a/x.json", "/fss/a/y.bin"]
    info = fs.info("shingle:///fss/a/y.bin")
    assert info["type"] == "file" and info["size"] == 10
    assert fs.info("/fss/a")["type"] == "directory"
    assert fs.exists("/fss/a/x.json") and not fs.exists("/fss/a/none")
    assert sorted(fs.find("/fss")) == ["/fss/a/x.json", "/fss/a/y.bin"]
    fs.mv("/fss/a/y.bin", "/fss/a/z.bin")
    assert client.read_bytes("/fss/a/z.bin") == b"0123456789"
    with fsspec.open("shingle:///fss/a/t.txt", "w", **opts(cluster)) as f:
        f.write("text\n")
    with fsspec.open("shingle:///fss/a/t.txt", "r", **opts(cluster)) as f:
        assert f.read() == "text\n"
    fs.rm("/fss", recursive=True)
    assert not client.exists("/fss")


def test_pandas_reads_and_writes_shingle_urls(cluster):
    df = pd.DataFrame({"step": range(100), "loss": [1.0 / (i + 1) for i in range(100)]})
    df.to_csv("shingle:///pandas.csv", index=False, storage_options=opts(cluster))
    back = pd.read_csv("shingle:///pandas.csv", storage_options=opts(cluster))
    pd.testing.assert_frame_equal(df, back)
    # The environment names the cluster when no storage options do.
    env = dict(os.environ, SHINGLE_CLUSTER_FILE=cluster["cluster_file"], SHINGLE_SECRET_FILE=cluster["secret_file"])
    code = "import pandas as pd; print(len(pd.read_csv('shingle:///pandas.csv')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "100"


def test_parquet_through_pyarrow(cluster, client):
    import pyarrow as pa
    import pyarrow.parquet as pq

    df = pd.DataFrame({"id": range(10_000), "text": [f"row {i}" for i in range(10_000)]})
    client.makedirs("/tables", exist_ok=True)
    df.to_parquet("shingle:///tables/a.parquet", storage_options=opts(cluster))
    pd.testing.assert_frame_equal(pd.read_parquet("shingle:///tables/a.parquet", storage_options=opts(cluster)), df)
    # pyarrow's own reader seeks to the footer and reads column chunks by range.
    fs = fsspec.filesystem("shingle", **opts(cluster))
    table = pq.read_table("/tables/a.parquet", filesystem=fs, columns=["id"])
    assert table.num_rows == 10_000 and table.column("id").to_pylist()[-1] == 9_999
    # With auto_mkdir, writing makes the missing directories (as fsspec's local one).
    auto = fsspec.filesystem("shingle", auto_mkdir=True, **opts(cluster))
    pq.write_table(pa.table({"x": [1, 2, 3]}), "/tables/new/b.parquet", filesystem=auto)
    assert pq.read_table("/tables/new/b.parquet", filesystem=fs).column("x").to_pylist() == [1, 2, 3]
