"""The Python client against a real `shingle dev` cluster; the FUSE mount of the same
cluster is the other client every result is checked against."""

import errno
import multiprocessing
import os
import stat
import time

import numpy as np
import pytest

import shingle
from shingle.data import ShingleDataset

MiB = 1 << 20


def rand(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_what_python_writes_the_mount_reads_and_back(client, cluster, tmpdir_fs):
    data = rand(9 * MiB + 12345, 1)  # more than two stripes, a partial last one
    with client.open(f"{tmpdir_fs}/a.bin", "wb") as f:
        assert f.write(data) == len(data)
    with open(cluster["mount"] + f"{tmpdir_fs}/a.bin", "rb") as m:
        assert m.read() == data
    other = rand(3 * MiB, 2)
    with open(cluster["mount"] + f"{tmpdir_fs}/b.bin", "wb") as m:
        m.write(other)
    with client.open(f"{tmpdir_fs}/b.bin") as f:
        assert f.read() == other
    assert client.read_bytes(f"{tmpdir_fs}/a.bin") == data


def test_reads_into_numpy_arrays_and_buffers_without_copies(client, tmpdir_fs):
    data = rand(6 * MiB, 3)
    client.write_bytes(f"{tmpdir_fs}/x.bin", data)
    with client.open(f"{tmpdir_fs}/x.bin", "rb") as f:
        arr = np.empty(len(data) // 4, dtype=np.float32)  # any dtype: raw bytes
        assert f.readinto(arr) == len(data)
        assert arr.tobytes() == data
        assert f.readinto(bytearray(10)) == 0  # at the end
        f.seek(100)
        ba = bytearray(1000)
        assert f.readinto(memoryview(ba)[10:510]) == 500
        assert bytes(ba[10:510]) == data[100:600]
        assert f.tell() == 600
        assert f.preadinto(ba, 4 * MiB - 3) == 1000
        assert bytes(ba) == data[4 * MiB - 3 : 4 * MiB + 997]
        assert f.tell() == 600
        with pytest.raises(TypeError):
            f.readinto(b"read-only")
        f.seek(0)
        buf = f.read_buffer(MiB)
        view = np.frombuffer(buf, dtype=np.uint8)
        assert not view.flags.writeable and view.tobytes() == data[:MiB]
        assert memoryview(buf).readonly and len(buf) == MiB
    whole = client.read_buffer(f"{tmpdir_fs}/x.bin")
    assert np.frombuffer(whole, dtype=np.uint8).tobytes() == data


def test_positions_modes_and_text(client, cluster, tmpdir_fs):
    p = f"{tmpdir_fs}/m.bin"
    with client.open(p, "xb") as f:
        f.write(b"hello world")
    with pytest.raises(FileExistsError):
        client.open(p, "xb")
    with client.open(p, "ab") as f:
        f.write(b"!")
    with client.open(p, "r+b") as f:
        f.seek(6)
        f.write(b"W")
        assert f.pread(5, 0) == b"hello"
        f.pwrite(b"H", 0)
        f.seek(0)
        assert f.read() == b"Hello World!"
        assert f.seek(-1, os.SEEK_END) == 11
        f.truncate(5)
    assert client.read_bytes(p) == b"Hello"
    with client.open(p, "wb") as f:
        pass
    assert client.stat(p).st_size == 0
    with client.open(f"{tmpdir_fs}/t.txt", "w") as f:
        f.write("one\ntwo\nthree\n")
    with client.open(f"{tmpdir_fs}/t.txt") as f:
        assert f.readline() == b"one\n"
        assert list(f) == [b"two\n", b"three\n"]
    with client.open(f"{tmpdir_fs}/t.txt", "r") as f:
        assert f.read().splitlines() == ["one", "two", "three"]
    with open(cluster["mount"] + f"{tmpdir_fs}/t.txt") as m:
        assert m.read() == "one\ntwo\nthree\n"
    with client.open(f"{tmpdir_fs}/t.txt", "rb") as f:
        with pytest.raises(OSError):
            f.write(b"x")


def test_names_and_attributes_match_the_mount(client, cluster, tmpdir_fs):
    mnt = cluster["mount"]
    client.makedirs(f"{tmpdir_fs}/a/b/c")
    client.makedirs(f"{tmpdir_fs}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        client.makedirs(f"{tmpdir_fs}/a/b")
    client.write_bytes(f"{tmpdir_fs}/a/f1", b"1")
    client.write_bytes(f"{tmpdir_fs}/a/b/f2", b"22")
    client.symlink("b/f2", f"{tmpdir_fs}/a/link")
    assert client.readlink(f"{tmpdir_fs}/a/link") == "b/f2"
    assert client.stat(f"{tmpdir_fs}/a/link").st_size == 2
    assert stat.S_ISLNK(client.lstat(f"{tmpdir_fs}/a/link").st_mode)
    assert client.read_bytes(f"{tmpdir_fs}/a/b/c/../../link") == b"22"
    assert sorted(client.listdir(f"{tmpdir_fs}/a")) == sorted(os.listdir(mnt + f"{tmpdir_fs}/a"))
    kinds = {e.name: e.kind for e in client.scandir(f"{tmpdir_fs}/a")}
    assert kinds == {"b": "dir", "f1": "file", "link": "symlink"}
    walked = [(d, sorted(ds), sorted(fs)) for d, ds, fs in client.walk(f"{tmpdir_fs}/a")]
    assert walked == [
        (f"{tmpdir_fs}/a", ["b"], ["f1", "link"]),
        (f"{tmpdir_fs}/a/b", ["c"], ["f2"]),
        (f"{tmpdir_fs}/a/b/c", [], []),
    ]
    client.chmod(f"{tmpdir_fs}/a/f1", 0o600)
    client.utime(f"{tmpdir_fs}/a/f1", ns=(1_000_000_000, 2_000_000_000))
    # The mount's listing above handed its kernel f1's attributes, which it may keep for
    # the mount's TTL (1 s), as after a stat: close-to-open, not a coherent cache.
    time.sleep(1.2)
    ours, theirs = client.stat(f"{tmpdir_fs}/a/f1"), os.stat(mnt + f"{tmpdir_fs}/a/f1")
    for field in ("st_mode", "st_ino", "st_size", "st_uid", "st_gid", "st_nlink", "st_mtime_ns"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.st_mtime_ns == 2_000_000_000 and stat.S_IMODE(ours.st_mode) == 0o600
    # scandir's entries carry their attributes (symbolic links not followed), as the
    # mount's lstat sees them; following a link reads its target.
    client.rename(f"{tmpdir_fs}/a/b/f2", f"{tmpdir_fs}/a/moved")  # its inode lives apart now
    for e in client.scandir(f"{tmpdir_fs}/a"):
        st, want = e.stat(follow_symlinks=False), os.lstat(mnt + f"{tmpdir_fs}/a/{e.name}")
        # A directory's counts and times follow its changes by a moment: another
        # client (the mount) may not see them yet.
        fields = ("st_mode", "st_ino") if e.is_dir() else ("st_mode", "st_ino", "st_size", "st_nlink", "st_mtime_ns")
        for field in fields:
            assert getattr(st, field) == getattr(want, field), (e.name, field)
        assert os.fspath(e) == f"{tmpdir_fs}/a/{e.name}"
    client.rename(f"{tmpdir_fs}/a/moved", f"{tmpdir_fs}/a/b/f2")
    link = next(e for e in client.scandir(f"{tmpdir_fs}/a") if e.name == "link")
    assert stat.S_ISLNK(link.stat(follow_symlinks=False).st_mode)
    assert link.stat().st_size == 2  # its target, b/f2
    client.rename(f"{tmpdir_fs}/a/f1", f"{tmpdir_fs}/a/b/f2")  # replaces
    assert client.read_bytes(f"{tmpdir_fs}/a/b/f2") == b"1"
    assert not client.exists(f"{tmpdir_fs}/a/f1")
    client.truncate(f"{tmpdir_fs}/a/b/f2", 4)
    assert os.path.getsize(mnt + f"{tmpdir_fs}/a/b/f2") == 4
    client.remove(f"{tmpdir_fs}/a/b/f2")
    client.remove(f"{tmpdir_fs}/a/link")
    client.rmdir(f"{tmpdir_fs}/a/b/c")
    assert client.listdir(f"{tmpdir_fs}/a/b") == []


def test_errors_are_oserrors_with_the_right_errno(client, cluster, tmpdir_fs):
    with pytest.raises(FileNotFoundError) as e:
        client.open(f"{tmpdir_fs}/missing")
    assert e.value.errno == errno.ENOENT and e.value.filename == f"{tmpdir_fs}/missing"
    client.mkdir(f"{tmpdir_fs}/d")
    client.write_bytes(f"{tmpdir_fs}/d/f", b"x")
    with pytest.raises(IsADirectoryError):
        client.open(f"{tmpdir_fs}/d")
    with pytest.raises(NotADirectoryError):
        client.listdir(f"{tmpdir_fs}/d/f")
    with pytest.raises(NotADirectoryError):
        client.stat(f"{tmpdir_fs}/d/f/x")
    with pytest.raises(OSError) as e:
        client.rmdir(f"{tmpdir_fs}/d")
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        client.mkdir(f"{tmpdir_fs}/d")
    with pytest.raises(OSError) as e:
        client.stat(f"{tmpdir_fs}/" + "n" * 300)
    assert e.value.errno == errno.ENAMETOOLONG
    client.symlink("loop", f"{tmpdir_fs}/loop")
    with pytest.raises(OSError) as e:
        client.open(f"{tmpdir_fs}/loop")
    assert e.value.errno == errno.ELOOP
    # Permissions are checked as the kernel checks them on a mount.
    client.write_bytes(f"{tmpdir_fs}/secret", b"root only")
    client.chmod(f"{tmpdir_fs}/secret", 0o600)
    client.chmod(tmpdir_fs, 0o755)
    with shingle.Client(cluster["cluster_file"], cluster["secret_file"], uid=1000, gid=1000, groups=[]) as user:
        with pytest.raises(PermissionError):
            user.open(f"{tmpdir_fs}/secret")
        with pytest.raises(PermissionError):
            user.write_bytes(f"{tmpdir_fs}/new", b"no")
        with pytest.raises(PermissionError):
            user.remove(f"{tmpdir_fs}/secret")
        assert user.stat(f"{tmpdir_fs}/secret").st_size == 9
        # A directory it may read but not search: names, and no attributes from them.
        client.mkdir(f"{tmpdir_fs}/listonly", 0o744)
        client.write_bytes(f"{tmpdir_fs}/listonly/f", b"x")
        client.chmod(f"{tmpdir_fs}/listonly", 0o744)
        (e,) = list(user.scandir(f"{tmpdir_fs}/listonly"))
        assert e.name == "f"
        with pytest.raises(PermissionError):
            e.stat()
    with pytest.raises(ConnectionError):
        shingle.Client("/nonexistent/cluster.toml", cluster["secret_file"], timeout=1)


def test_client_keys_read_and_are_refused_what_their_grant_does_not_allow(client, cluster, tmpdir_fs):
    """A host given a client key instead of the cluster secret (docs/operations.md
    "Security"): a read-only key reads and its changes fail with EROFS; a read-write
    key's root acts as nobody."""
    import subprocess
    import tempfile

    binary = os.environ["SHINGLE_BIN"]
    data = rand(5 * MiB, 9)
    client.write_bytes(f"{tmpdir_fs}/shared.bin", data)
    client.chmod(tmpdir_fs, 0o777)
    keys = tempfile.mkdtemp(prefix="shingle-keys-")
    made = {}
    for name, extra in [("py-reader", ["--read-only"]), ("py-writer", [])]:
        path = os.path.join(keys, f"{name}.key")
        subprocess.run(
            [binary, "client", "grant", name, "--out", path, *extra,
             "--cluster-file", cluster["cluster_file"], "--secret-file", cluster["secret_file"]],
            check=True, capture_output=True,
        )
        made[name] = path
    with shingle.Client(cluster["cluster_file"], made["py-reader"]) as reader:
        assert reader.read_bytes(f"{tmpdir_fs}/shared.bin") == data
        with pytest.raises(OSError) as e:
            reader.write_bytes(f"{tmpdir_fs}/nope", b"x")
        assert e.value.errno == errno.EROFS
    with shingle.Client(cluster["cluster_file"], made["py-writer"]) as writer:
        writer.write_bytes(f"{tmpdir_fs}/mine", b"written with a key")
        st = writer.stat(f"{tmpdir_fs}/mine")
        assert (st.st_uid, st.st_gid) == (65534, 65534)
        with pytest.raises(PermissionError):
            writer.write_bytes(f"{tmpdir_fs}/shared.bin", b"root's file, mode 644")
    assert client.read_bytes(f"{tmpdir_fs}/mine") == b"written with a key"


def test_a_confined_key_sees_its_directory_as_the_root(client, cluster, tmpdir_fs):
    """A key granted `--path` (decision 0022): its paths start at that directory, and
    nothing outside it can be named."""
    import subprocess
    import tempfile

    binary = os.environ["SHINGLE_BIN"]
    client.makedirs(f"{tmpdir_fs}/team/data", exist_ok=True)
    client.write_bytes(f"{tmpdir_fs}/team/data/shard-0", b"inside")
    client.write_bytes(f"{tmpdir_fs}/secret.bin", b"outside")
    key = os.path.join(tempfile.mkdtemp(prefix="shingle-keys-"), "py-team.key")
    subprocess.run(
        [binary, "client", "grant", "py-team", "--no-root-squash", "--path", f"{tmpdir_fs}/team",
         "--out", key, "--cluster-file", cluster["cluster_file"], "--secret-file", cluster["secret_file"]],
        check=True, capture_output=True,
    )
    with shingle.Client(cluster["cluster_file"], key) as team:
        assert team.listdir("/") == ["data"]
        assert team.read_bytes("/data/shard-0") == b"inside"
        assert team.read_bytes("/../data/shard-0") == b"inside", ".. of the root is the root"
        team.write_bytes("/data/shard-1", b"new")
        team.rename("/data/shard-1", "/shard-1")
        with pytest.raises(FileNotFoundError):
            team.stat("/secret.bin")
    assert client.read_bytes(f"{tmpdir_fs}/team/shard-1") == b"new"


def test_an_open_file_outlives_its_name(client, tmpdir_fs):
    data = rand(5 * MiB, 4)
    client.write_bytes(f"{tmpdir_fs}/gone", data)
    with client.open(f"{tmpdir_fs}/gone") as f:
        client.remove(f"{tmpdir_fs}/gone")
        assert not client.exists(f"{tmpdir_fs}/gone")
        assert f.read() == data


def test_prefetch_serves_unchanged_files_and_never_stale_ones(client, cluster, tmpdir_fs):
    paths = [f"{tmpdir_fs}/s{i}" for i in range(6)]
    for i, p in enumerate(paths):
        client.write_bytes(p, rand(MiB + i, 10 + i))
    before = client.prefetch_stats()
    client.prefetch(paths)
    for _ in range(200):
        s = client.prefetch_stats()
        if s["pending"] == 0 and s["files"] >= len(paths):
            break
        import time

        time.sleep(0.05)
    assert client.prefetch_stats()["files"] == len(paths)
    # Another client changes one file after the prefetch: an open must see the change.
    with open(cluster["mount"] + paths[0], "r+b") as m:
        m.write(b"changed")
    assert client.read_bytes(paths[0])[:7] == b"changed"
    for i, p in enumerate(paths[1:], 1):
        assert client.read_bytes(p) == rand(MiB + i, 10 + i)
    after = client.prefetch_stats()
    assert after["hits"] - before["hits"] == len(paths) - 1
    assert after["misses"] - before["misses"] >= 1
    assert after["files"] == 0 and after["bytes"] == 0


def item_sizes(ds, indices):
    return [(i, len(ds[i]), bytes(ds[i][:8])) for i in indices]


def read_in_child(args):
    ds, i = args
    return i, bytes(ds[i])


def test_dataset_in_forked_and_spawned_workers(client, cluster, tmpdir_fs):
    paths = []
    for i in range(12):
        p = f"{tmpdir_fs}/shards/{i:03}.bin"
        if i == 0:
            client.makedirs(f"{tmpdir_fs}/shards", exist_ok=True)
        client.write_bytes(p, rand(256 * 1024 + i, 100 + i))
        paths.append(p)
    ds = ShingleDataset(root=f"{tmpdir_fs}/shards", cluster_file=cluster["cluster_file"], secret_file=cluster["secret_file"])
    assert ds.paths == paths and len(ds) == 12
    assert bytes(ds[0]) == rand(256 * 1024, 100)  # the parent's own connection exists
    expected = {i: rand(256 * 1024 + i, 100 + i) for i in range(12)}
    for method in ("fork", "spawn"):
        with multiprocessing.get_context(method).Pool(2) as pool:
            got = dict(pool.map(read_in_child, [(ds, i) for i in range(12)]))
        assert got == expected, method
    ds.set_order([5, 3, 1, 0], stride=1)
    assert ds._next(3) == [paths[1], paths[0]]
    shuffled = ShingleDataset(paths, client=client, transform=lambda b: np.frombuffer(b, dtype=np.uint8).sum())
    assert shuffled[-1] == np.frombuffer(expected[11], dtype=np.uint8).sum()
    with pytest.raises(IndexError):
        shuffled[12]
