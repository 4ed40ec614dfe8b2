"""The index-version format: atomic write, the typed manifest, the one ``verify`` and its refusal codes."""

import json

import numpy as np
import pytest

from engine.index import IndexVersion
from engine.version import files, store
from engine.version.manifest import READABLE_SCHEMAS, SCHEMA_VERSION, Expect, IndexVersionError, read_manifest, verify
from tests.conftest import served

N, D, M0 = 12, 8, 4


def _version(root, name="v1", *, extra=None, manifest_update=None):
    """A complete tiny version (identity rotation, flat stage 1, no router) written by the format's writers."""
    X = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    writers, core, stage1 = files.dense_files(np.eye(D), X, [f"d{i}" for i in range(N)], M0)
    writers.update(extra or {})
    manifest = {"collection": "c", "encoder": {"onnx_sha256": "abc", "max_tokens": 256}, "dimension": D, "m0": M0,
                "shortlist": 5, "core": core, "stage1": stage1, "corpus": {"documents": N}, **(manifest_update or {})}
    return store.write_version(root / "c", name, writers, manifest), X


def test_write_verify_and_live_pointer(tmp_path):
    path, X = _version(tmp_path)
    m = verify(path, Expect(encoder_sha256="abc", max_tokens=256, dimension=D, collection="c", version="v1"))
    assert m.version == "v1" and set(m.files) == {"rotation.npy", "docs.npy", "doc_sqnorm_m0.npy", "doc_ids.json",
                                                  "stage1.faiss"}
    assert m.schema_version == SCHEMA_VERSION == 5 and SCHEMA_VERSION in READABLE_SCHEMAS
    v = IndexVersion.load(path)
    np.testing.assert_array_equal(v.docs, X)
    np.testing.assert_allclose(v.doc_sqnorm_m0, (X[:, :M0] ** 2).sum(1), rtol=1e-6)
    assert served(v, X[3], 3, "full").ids[0] == "d3"
    store.write_live_pointer(tmp_path / "c", "v1")
    assert store.read_live_pointer(tmp_path / "c") == "v1"
    assert store.resolve_version_path(tmp_path, "c", None) == path
    assert store.list_versions(tmp_path / "c") == ["v1"]
    with pytest.raises(FileExistsError):
        _version(tmp_path)


@pytest.mark.parametrize("damage,code", [
    (lambda p: (p / "docs.npy").write_bytes(b"corrupt"), "checksum"),
    (lambda p: (p / "doc_ids.json").unlink(), "checksum"),
    (lambda p: (p / "manifest.json").unlink(), "missing"),
    (lambda p: (p / "manifest.json").write_text("{"), "schema"),
    (lambda p: (p / "manifest.json").write_text(json.dumps(dict(json.loads((p / "manifest.json").read_text()),
                                                                schema_version=99))), "schema"),
    (lambda p: (p / "manifest.json").write_text(json.dumps(dict(json.loads((p / "manifest.json").read_text()),
                                                                surprise={"a": 1}))), "schema"),
])
def test_refuses_damaged_versions(tmp_path, damage, code):
    path, _ = _version(tmp_path)
    damage(path)
    with pytest.raises(IndexVersionError) as e:
        verify(path)
    assert e.value.code == code


@pytest.mark.parametrize("expect,code", [
    (Expect(encoder_sha256="other"), "encoder_mismatch"),
    (Expect(max_tokens=128), "encoder_mismatch"),
    (Expect(dimension=16), "dimension_mismatch"),
    (Expect(collection="other"), "collection_mismatch"),
    (Expect(version="v2"), "schema"),
])
def test_refuses_what_the_caller_does_not_run(tmp_path, expect, code):
    path, _ = _version(tmp_path)
    with pytest.raises(IndexVersionError) as e:
        verify(path, expect)
    assert e.value.code == code
    with pytest.raises(IndexVersionError) as e:  # the loader runs the same verification
        IndexVersion.load(path, expect=expect)
    assert e.value.code == code


def test_refuses_routers_over_other_features(tmp_path):
    """A router fitted on other features than this build computes is refused (router_mismatch), checked once."""
    router = {"feature_names": ["a", "b"], "default_pair": [4, 8],
              "pairs": {"4_8": {"file": "router_4_8.txt", "action_pair": [4, 8], "calibration_predictions": [0.0]}}}
    path, _ = _version(tmp_path, extra={"router_4_8.txt": lambda p: p.write_text("not read")},
                       manifest_update={"router": router})
    with pytest.raises(IndexVersionError) as e:
        verify(path)
    assert e.value.code == "router_mismatch"
    verify(path, Expect(router_features=None))  # the check can be turned off, the rest verifies


def test_a_section_must_name_only_checksummed_files(tmp_path):
    """Every file a section names is covered by the checksums: a manifest that names a file no writer wrote is
    refused at write time, before anything becomes visible."""
    with pytest.raises(IndexVersionError) as e:
        _version(tmp_path, manifest_update={"rerank": {"text_file": "encoder_text.json"}})
    assert e.value.code == "schema"
    assert store.list_versions(tmp_path / "c") == []


def test_an_invalid_manifest_is_refused_before_any_writer_runs(tmp_path):
    ran = []
    with pytest.raises(IndexVersionError) as e:
        store.write_version(tmp_path / "c", "v1", {"a": lambda p: ran.append(p)}, {"collection": "c"})
    assert e.value.code == "schema" and ran == []


def test_schema_1_manifests_read_with_the_fixed_file_names(tmp_path):
    path, _ = _version(tmp_path)
    raw = json.loads((path / "manifest.json").read_text())
    for key in ("core",):
        raw.pop(key)
    raw["stage1"].pop("file")
    raw["schema_version"] = 1
    (path / "manifest.json").write_text(json.dumps(raw))
    m = verify(path)
    assert m.schema_version == 1 and m.core.docs == "docs.npy" and m.stage1.file == "stage1.faiss"
    assert IndexVersion.load(path).size == N


def test_crash_mid_build_leaves_no_visible_version(tmp_path):
    def boom(p):
        p.write_text("half")
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        _version(tmp_path, name="v2", extra={"x": boom})
    assert list((tmp_path / "c").iterdir()) == []
    assert store.list_versions(tmp_path / "c") == []
    with pytest.raises(IndexVersionError):
        store.write_live_pointer(tmp_path / "c", "v2")


def test_manifest_is_written_last(tmp_path):
    """While writers run, the temporary directory has no manifest."""
    seen = []

    def spy(p):
        seen.append(sorted(x.name for x in p.parent.iterdir()))
        p.write_text("x")

    _version(tmp_path, name="v3", extra={"f1": spy, "f2": spy})
    assert seen and all("manifest.json" not in names for names in seen)
    assert read_manifest(tmp_path / "c" / "v3").version == "v3"
