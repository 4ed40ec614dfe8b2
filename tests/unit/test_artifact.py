import json

import numpy as np
import pytest

from engine.version import store


def _writers():
    return {"a.npy": lambda p: np.save(p, np.arange(4)), "b.json": lambda p: p.write_text("[1]")}


MANIFEST = {"encoder": {"onnx_sha256": "abc"}, "dimension": 4, "collection": "c"}


def test_write_verify_and_live_pointer(tmp_path):
    path = store.write_version(tmp_path / "c", "v1", _writers(), MANIFEST)
    m = store.verify_version(path, encoder_sha256="abc", dimension=4)
    assert m["version"] == "v1" and set(m["files"]) == {"a.npy", "b.json"}
    assert m["schema_version"] == store.SCHEMA_VERSION
    store.write_live_pointer(tmp_path / "c", "v1")
    assert store.read_live_pointer(tmp_path / "c") == "v1"
    assert store.list_versions(tmp_path / "c") == ["v1"]
    with pytest.raises(FileExistsError):
        store.write_version(tmp_path / "c", "v1", _writers(), MANIFEST)


@pytest.mark.parametrize("damage,code", [
    (lambda p: (p / "a.npy").write_bytes(b"corrupt"), "checksum"),
    (lambda p: (p / "b.json").unlink(), "checksum"),
    (lambda p: (p / "manifest.json").unlink(), "missing"),
    (lambda p: (p / "manifest.json").write_text("{"), "schema"),
])
def test_refuses_damaged_versions(tmp_path, damage, code):
    path = store.write_version(tmp_path / "c", "v1", _writers(), MANIFEST)
    damage(path)
    with pytest.raises(store.IndexVersionError) as e:
        store.verify_version(path)
    assert e.value.code == code


def test_refuses_encoder_and_dimension_mismatch(tmp_path):
    path = store.write_version(tmp_path / "c", "v1", _writers(), MANIFEST)
    with pytest.raises(store.IndexVersionError) as e:
        store.verify_version(path, encoder_sha256="other")
    assert e.value.code == "encoder_mismatch"
    with pytest.raises(store.IndexVersionError) as e:
        store.verify_version(path, dimension=8)
    assert e.value.code == "dimension_mismatch"


def test_crash_mid_build_leaves_no_visible_version(tmp_path):
    def boom(p):
        p.write_text("half")
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        store.write_version(tmp_path / "c", "v2", {"a.npy": lambda p: np.save(p, 1), "x": boom}, MANIFEST)
    assert list((tmp_path / "c").iterdir()) == []
    assert store.list_versions(tmp_path / "c") == []
    with pytest.raises(store.IndexVersionError):
        store.write_live_pointer(tmp_path / "c", "v2")


def test_manifest_is_written_last(tmp_path, monkeypatch):
    """While writers run, the temporary directory has no manifest."""
    seen = []

    def spy(p):
        seen.append(sorted(x.name for x in p.parent.iterdir()))
        p.write_text("x")

    store.write_version(tmp_path / "c", "v3", {"f1": spy, "f2": spy}, MANIFEST)
    assert all("manifest.json" not in names for names in seen)
    assert json.loads((tmp_path / "c" / "v3" / "manifest.json").read_text())["version"] == "v3"
