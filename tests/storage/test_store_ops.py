"""Every Store operation of docs/storage-api.md, on a local folder, memory:// and a real S3 server."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from tessera.storage import (
    BucketNotFound,
    InvalidURL,
    NotFound,
    ObjectInfo,
    PermissionDenied,
    RetryPolicy,
    StorageError,
    open_store,
    split_url,
)


@pytest.fixture
def store(any_store_url):
    return open_store(any_store_url)


def keys_of(infos) -> list[str]:
    return sorted(info.key for info in infos)


# --- get / put ------------------------------------------------------------------------------------


def test_put_then_get_round_trips_and_overwrites(store):
    store.put("a/b/c.bin", b"first")
    assert store.get("a/b/c.bin") == b"first"
    store.put("a/b/c.bin", b"second, longer")
    assert store.get("a/b/c.bin") == b"second, longer"


@pytest.mark.parametrize("payload", [bytearray(b"from a bytearray"), memoryview(b"from a memoryview")])
def test_put_accepts_bytes_like(store, payload):
    store.put("k", payload)
    assert store.get("k") == bytes(payload)


def test_empty_object(store):
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.head("empty").size == 0
    assert store.exists("empty")


def test_get_range_is_half_open(store):
    data = bytes(range(256)) * 4
    store.put("r.bin", data)
    assert store.get_range("r.bin", 0, 10) == data[:10]
    assert store.get_range("r.bin", 100, 356) == data[100:356]
    assert store.get_range("r.bin", 1000, 1024) == data[1000:]
    assert store.get_range("r.bin", 5, 6) == data[5:6]
    assert store.get_range("r.bin", 7, 7) == b""


def test_get_ranges_keeps_order(store):
    data = os.urandom(100_000)
    store.put("r.bin", data)
    ranges = [(90_000, 100_000), (0, 1), (10, 20_000), (15, 25), (500, 500), (99_999, 100_000)]
    assert store.get_ranges("r.bin", ranges) == [data[s:e] for s, e in ranges]
    assert store.get_ranges("r.bin", []) == []


def test_put_file_small_and_multipart(store, tmp_path):
    small = tmp_path / "small.bin"
    small.write_bytes(b"tiny file")
    store.put_file("files/small.bin", small)
    assert store.get("files/small.bin") == b"tiny file"

    big = tmp_path / "big.bin"  # above the 16 MiB multipart threshold, last part short
    data = os.urandom((17 << 20) + 12345)
    big.write_bytes(data)
    store.put_file("files/big.bin", big)
    assert store.head("files/big.bin").size == len(data)
    assert store.get("files/big.bin") == data


# --- put_if_absent --------------------------------------------------------------------------------


def test_put_if_absent_writes_once(store):
    assert store.put_if_absent("lock", b"mine") is True
    assert store.put_if_absent("lock", b"theirs") is False
    assert store.get("lock") == b"mine"


def test_put_if_absent_after_plain_put(store):
    store.put("k", b"existing")
    assert store.put_if_absent("k", b"new") is False
    assert store.get("k") == b"existing"


def test_put_if_absent_race_has_exactly_one_winner(store):
    """Threads released together: a check-then-put would let several win; a conditional write cannot."""
    # SeaweedFS serialises conditional PUTs on one key and answers each loser after ~0.5-1 s.
    writers, rounds = (4, 1) if store.url.startswith("s3://") else (8, 5)
    for rnd in range(rounds):
        key = f"race/{rnd}"
        barrier = threading.Barrier(writers)

        def attempt(i: int, key=key, barrier=barrier) -> bool:
            barrier.wait()
            return store.put_if_absent(key, f"writer-{i}".encode())

        with ThreadPoolExecutor(writers) as pool:
            results = list(pool.map(attempt, range(writers)))
        assert results.count(True) == 1, f"round {rnd}: {results}"
        assert store.get(key) == f"writer-{results.index(True)}".encode()


def test_put_if_absent_sees_objects_written_by_another_client(s3_server, s3_bucket):
    """On S3 the check is the server's (If-None-Match: *), not a cache of this client."""
    store = open_store(s3_bucket)
    s3_server.boto3_client().put_object(Bucket=s3_bucket[5:], Key="other", Body=b"boto")
    assert store.put_if_absent("other", b"tessera") is False
    assert store.get("other") == b"boto"


# --- head / exists ---------------------------------------------------------------------------------


def test_head_and_exists(store):
    store.put("dir/obj.bin", b"x" * 1234)
    info = store.head("dir/obj.bin")
    assert isinstance(info, ObjectInfo)
    assert info.key == "dir/obj.bin"
    assert info.size == 1234
    assert info.etag
    assert isinstance(info.last_modified, datetime)
    assert store.exists("dir/obj.bin")
    assert not store.exists("dir/other.bin")
    assert not store.exists("dir")  # a "folder" is not an object


def test_etag_changes_with_content(store):
    store.put("e", b"one")
    first = store.head("e").etag
    store.put("e", b"two, different")
    assert store.head("e").etag != first


# --- list ------------------------------------------------------------------------------------------


def test_list_is_recursive_and_relative(store):
    for key in ("a.txt", "d/1.bin", "d/2.bin", "d/sub/3.bin", "dx/4.bin"):
        store.put(key, key.encode())
    infos = list(store.list())
    assert keys_of(infos) == ["a.txt", "d/1.bin", "d/2.bin", "d/sub/3.bin", "dx/4.bin"]
    sizes = {i.key: i.size for i in infos}
    assert sizes["d/sub/3.bin"] == len(b"d/sub/3.bin")
    assert keys_of(store.list("d/")) == ["d/1.bin", "d/2.bin", "d/sub/3.bin"]
    assert keys_of(store.list("d/sub")) == ["d/sub/3.bin"]
    assert keys_of(store.list("nothing/here")) == []


def test_list_prefix_is_a_string_prefix(store):
    """'Every object whose key starts with prefix', not only whole path segments."""
    for key in ("logs/2024-01.txt", "logs/2024-02.txt", "logs/2025-01.txt", "logs2/x"):
        store.put(key, b".")
    assert keys_of(store.list("logs/2024-")) == ["logs/2024-01.txt", "logs/2024-02.txt"]
    assert keys_of(store.list("logs")) == ["logs/2024-01.txt", "logs/2024-02.txt", "logs/2025-01.txt", "logs2/x"]


def test_list_start_after_returns_only_later_keys(store):
    """S3's StartAfter: a poller passes the last key it read and gets only newer ones, in order."""
    for key in ("c/0001", "c/0002", "c/0010", "c/sub/x", "d/0001"):
        store.put(key, b".")
    assert [i.key for i in store.list("c/", start_after="c/0002")] == ["c/0010", "c/sub/x"]
    assert [i.key for i in store.list("c/", start_after="c/0001")] == ["c/0002", "c/0010", "c/sub/x"]
    assert [i.key for i in store.list("c/", start_after="c/0")] == ["c/0001", "c/0002", "c/0010", "c/sub/x"]
    assert [i.key for i in store.list("c/", start_after="c/sub/x")] == []
    assert [i.key for i in store.list("", start_after="c/sub/x")] == ["d/0001"]


def test_list_streams(store):
    store.put("one", b"1")
    iterator = store.list()
    assert next(iterator).key == "one"


def test_list_of_empty_store(store):
    assert list(store.list()) == []


def test_list_paginates_and_delete_many_batches(s3_bucket):
    """More than 1000 objects: ListObjectsV2 and DeleteObjects both need several requests."""
    store = open_store(s3_bucket)
    keys = [f"many/{i:05d}.bin" for i in range(1100)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put(k, k.encode()), keys))
    store.put("many0/outside", b".")
    store.put("aaa", b".")

    listed = list(store.list("many/"))
    assert len(listed) == len(keys)
    assert sorted(i.key for i in listed) == keys
    assert all(i.size == len(i.key) for i in listed)
    assert len(list(store.list())) == len(keys) + 2

    store.delete_many(keys + ["many/not-there"])
    assert list(store.list("many/")) == []
    assert keys_of(store.list()) == ["aaa", "many0/outside"]


# --- delete / copy ---------------------------------------------------------------------------------


def test_delete(store):
    store.put("gone/soon", b"x")
    store.delete("gone/soon")
    assert not store.exists("gone/soon")
    with pytest.raises(NotFound):
        store.get("gone/soon")
    store.delete("gone/soon")  # absent is fine
    store.delete("never/was")


def test_delete_many(store):
    for i in range(5):
        store.put(f"dm/{i}", b"x")
    store.put("keep", b"x")
    store.delete_many([f"dm/{i}" for i in range(5)] + ["dm/absent"])
    assert keys_of(store.list()) == ["keep"]
    store.delete_many([])
    store.delete_many(iter(["keep"]))  # any iterable
    assert list(store.list()) == []


def test_copy(store):
    store.put("src/obj", b"payload")
    store.put("dst/obj", b"old")
    store.copy("src/obj", "dst/obj")
    assert store.get("dst/obj") == b"payload"
    assert store.get("src/obj") == b"payload"
    store.copy("src/obj", "fresh/copy")
    assert store.get("fresh/copy") == b"payload"
    with pytest.raises(NotFound):
        store.copy("src/missing", "dst/x")


# --- child / url_for / local_path ------------------------------------------------------------------


def test_child_store(store):
    sub = store.child("runs/7")
    sub.put("ckpt/model.bin", b"weights")
    assert store.get("runs/7/ckpt/model.bin") == b"weights"
    assert sub.head("ckpt/model.bin").key == "ckpt/model.bin"
    assert keys_of(sub.list()) == ["ckpt/model.bin"]
    assert sub.url == store.url_for("runs/7")
    assert sub.url_for("ckpt/model.bin") == store.url_for("runs/7/ckpt/model.bin")
    assert store.child("runs/").child("7").get("ckpt/model.bin") == b"weights"


def test_url_for_round_trips_through_open_store(store):
    store.put("d/k.bin", b"found me")
    url = store.url_for("d/k.bin")
    assert url.endswith("/d/k.bin")
    assert url.startswith(store.url)
    root, name = split_url(url)
    assert name == "k.bin"
    assert open_store(root).get(name) == b"found me"


def test_local_path(store, any_store_url):
    store.put("m/file.bin", b"mmap me")
    path = store.local_path("m/file.bin")
    if "://" in any_store_url:
        assert path is None
    else:
        assert isinstance(path, Path)
        assert path.read_bytes() == b"mmap me"


def test_store_url_is_canonical(s3_bucket, tmp_path):
    assert open_store(s3_bucket).url == s3_bucket
    assert open_store(f"{s3_bucket}/some/prefix/").url == f"{s3_bucket}/some/prefix"
    assert open_store(f"{s3_bucket}/some/prefix").url_for("k") == f"{s3_bucket}/some/prefix/k"
    assert open_store(f"file://{tmp_path}").url == open_store(str(tmp_path)).url


def test_prefixed_s3_store_is_isolated(s3_bucket):
    root = open_store(s3_bucket)
    a, b = open_store(f"{s3_bucket}/a"), open_store(f"{s3_bucket}/b")
    a.put("k", b"in a")
    b.put("k", b"in b")
    assert root.get("a/k") == b"in a"
    assert keys_of(a.list()) == ["k"]
    assert keys_of(root.list()) == ["a/k", "b/k"]


# --- keys that try to escape -----------------------------------------------------------------------

BAD_KEYS = ["../escape", "a/../../escape", "..", "/etc/passwd", "a//b", "./a", "a/./b", "", "a\\..\\b"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_traversal_keys_rejected(store, key):
    store.put("ok", b"x")
    ops = {
        "get": lambda: store.get(key),
        "put": lambda: store.put(key, b"x"),
        "put_if_absent": lambda: store.put_if_absent(key, b"x"),
        "head": lambda: store.head(key),
        "exists": lambda: store.exists(key),
        "get_range": lambda: store.get_range(key, 0, 1),
        "get_ranges": lambda: store.get_ranges(key, [(0, 1)]),
        "delete": lambda: store.delete(key),
        "copy to": lambda: store.copy("ok", key),
        "copy from": lambda: store.copy(key, "ok2"),
        "delete_many": lambda: store.delete_many(["ok", key]),
    }
    for name, op in ops.items():
        with pytest.raises(InvalidURL):
            op()
            pytest.fail(f"{name}({key!r}) did not raise InvalidURL")
    assert store.exists("ok"), "delete_many must validate every key before deleting any"


@pytest.mark.parametrize("prefix", ["..", "../x", "a/../../x", "a/.."])
def test_child_cannot_climb_out(store, prefix):
    with pytest.raises(InvalidURL):
        store.child(prefix)


def test_traversal_writes_nothing_outside_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    store = open_store(str(root))
    with pytest.raises(InvalidURL):
        store.put("../escape.txt", b"x")
    with pytest.raises(InvalidURL):
        open_store("s3://bucket/../other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


# --- errors: missing things, wrong credentials -----------------------------------------------------


def test_missing_key_names_the_url(store):
    url = store.url_for("no/such.bin")
    for op in (lambda: store.get("no/such.bin"), lambda: store.head("no/such.bin"),
               lambda: store.get_range("no/such.bin", 0, 4)):
        with pytest.raises(NotFound) as info:
            op()
        assert url in str(info.value)
        assert info.value.url == url
        assert isinstance(info.value, StorageError)


def test_missing_bucket_names_the_bucket(s3_bucket):
    store = open_store("s3://tessera-no-such-bucket/pre", retry=RetryPolicy(max_attempts=2))
    for op in (lambda: store.get("k"), lambda: store.put("k", b"x"), lambda: list(store.list())):
        with pytest.raises(BucketNotFound) as info:
            op()
        assert "tessera-no-such-bucket" in str(info.value)
        assert "tessera-no-such-bucket" in info.value.url


def _assert_credentials_error(info) -> None:
    message = str(info.value)
    assert "AWS_ACCESS_KEY_ID" in message and "S3_ENDPOINT_URL" in message, message
    assert info.value.url.startswith("s3://")


@pytest.mark.parametrize("override", [{"secret_access_key": "wrong-secret"}, {"access_key_id": "UNKNOWNKEY"}])
def test_wrong_credentials_are_permission_denied_fast(s3_bucket, override):
    good = open_store(s3_bucket)
    good.put("k", b"x")
    bad = open_store(s3_bucket, **override)
    start = time.monotonic()
    for op in (lambda: bad.get("k"), lambda: bad.put("k2", b"x"), lambda: bad.head("k"),
               lambda: list(bad.list())):
        with pytest.raises(PermissionDenied) as info:
            op()
        _assert_credentials_error(info)
    assert time.monotonic() - start < 5, "a 403 is permanent: it must not be retried with backoff"
    assert not good.exists("k2")


def test_wrong_credentials_from_env(s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(PermissionDenied) as info:
        open_store(s3_bucket).get("k")
    _assert_credentials_error(info)


def test_no_credentials_at_all(s3_bucket, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(PermissionDenied) as info:
        open_store(s3_bucket).put("k", b"x")
    _assert_credentials_error(info)


def test_credentials_come_from_env(s3_bucket, s3_env):
    """The fixture only set env vars; explicit options must give the same store."""
    open_store(s3_bucket).put("via-env", b"1")
    explicit = open_store(s3_bucket, endpoint=s3_env["S3_ENDPOINT_URL"],
                          access_key_id=s3_env["AWS_ACCESS_KEY_ID"],
                          secret_access_key=s3_env["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
    assert explicit.get("via-env") == b"1"
