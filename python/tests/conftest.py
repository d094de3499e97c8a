"""A `shingle dev` cluster with its FUSE mount for the whole test session.

The binary is ``SHINGLE_BIN`` (default ``target/release/shingle`` of this checkout).
The mount lets tests check that what Python writes is what every other client sees.
"""

import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOUNTED = "shingle: mounted at "


@pytest.fixture(scope="session")
def cluster():
    binary = os.environ.get("SHINGLE_BIN", str(ROOT / "target" / "release" / "shingle"))
    if not os.path.exists(binary):
        raise RuntimeError(f"{binary} is missing: cargo build --release -p shingle (or set SHINGLE_BIN)")
    work = tempfile.mkdtemp(prefix="shingle-py-")
    data, mount = os.path.join(work, "data"), os.path.join(work, "mnt")
    proc = subprocess.Popen(
        [binary, "dev", "--data", data, "--mount", mount],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(MOUNTED):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.time() + 120
    while not ready.wait(0.2):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError("shingle dev did not mount:\n" + "".join(lines[-40:]))
    env = {
        "cluster_file": os.path.join(data, "cluster.toml"),
        "secret_file": os.path.join(data, "secret"),
        "mount": mount,
    }
    try:
        yield env
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        warnings = [l for l in lines if " WARN " in l or " ERROR " in l]
        assert not warnings, "shingle dev logged:\n" + "".join(warnings[-20:])


@pytest.fixture(scope="session")
def client(cluster):
    import shingle

    with shingle.Client(cluster["cluster_file"], cluster["secret_file"]) as c:
        yield c


@pytest.fixture
def tmpdir_fs(client, request):
    """A fresh directory on the cluster for one test: (path, path through the mount)."""
    name = "/t-" + request.node.name.replace("[", "-").replace("]", "")
    client.makedirs(name, exist_ok=True)
    return name
