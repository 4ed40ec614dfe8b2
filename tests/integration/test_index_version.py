"""Loading a built version: verification refuses damage and mismatches; the served path equals the offline one."""

import shutil

import numpy as np
import pytest

from adawidth.funnel import exact_stage1
from adawidth.prefix import prefix_normalize
from engine.index import IndexVersion
from engine.version.manifest import SCHEMA_VERSION, Expect, IndexVersionError, read_manifest

pytestmark = pytest.mark.integration


def test_manifest_describes_the_version(scifact_version, encoder):
    m = read_manifest(scifact_version)
    assert m.schema_version == SCHEMA_VERSION
    assert m.encoder.onnx_sha256 == encoder.info.onnx_sha256
    assert m.encoder.max_tokens == 256 and m.encoder.pooling.startswith("mean")
    assert m.dimension == 384 and m.m0 == 64 and m.shortlist == 500
    assert m.adapter.kind == "adapter" and m.adapter.training["verify"]["max_gram_error"] < 1e-4
    assert len(m.router.feature_names) == 18
    assert {"rotation.npy", "docs.npy", "doc_ids.json", "stage1.faiss", "router_64_128.txt"} <= set(m.files)
    assert {name for _, name in m.section_files()} <= set(m.files)  # every file a section names is checksummed


def _copy(src, tmp_path):
    dst = tmp_path / "coll" / src.name
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["truncate_docs", "drop_router", "flip_rotation"])
def test_loader_refuses_damaged_copies(scifact_version, tmp_path, damage):
    v = _copy(scifact_version, tmp_path)
    if damage == "truncate_docs":
        with open(v / "docs.npy", "r+b") as fh:
            fh.truncate(1000)
    elif damage == "drop_router":
        (v / "router_64_128.txt").unlink()
    else:
        R = np.load(v / "rotation.npy")
        np.save(v / "rotation.npy", -R)
    with pytest.raises(IndexVersionError) as e:
        IndexVersion.load(v)
    assert e.value.code == "checksum"


def test_loader_refuses_other_encoder_max_tokens_or_dimension(scifact_version, encoder):
    IndexVersion.load(scifact_version, expect=Expect.of_encoder(encoder, collection="scifact"))
    for expect, code in ((Expect(encoder_sha256="0" * 64), "encoder_mismatch"),
                         (Expect(max_tokens=128), "encoder_mismatch"),
                         (Expect(dimension=768), "dimension_mismatch"),
                         (Expect(collection="nfcorpus"), "collection_mismatch")):
        with pytest.raises(IndexVersionError) as e:
            IndexVersion.load(scifact_version, expect=expect)
        assert e.value.code == code


def test_faiss_stage1_equals_the_numpy_reference(scifact_version, encoder):
    v = IndexVersion.load(scifact_version)
    q = v.rotate(encoder.encode(["hypertension in elderly patients"])[0], 384)
    qp = prefix_normalize(q[None], 64)
    cos, rows = v.stage1_index.search(qp, 500)
    ref_rows, ref_cos = exact_stage1(q, prefix_normalize(np.asarray(v.docs), 64), 64, 500)
    assert np.allclose(cos[0], ref_cos, atol=1e-5)
    assert len(set(rows[0][:100]) ^ set(ref_rows[:100])) <= 2  # allow a float tie at the cutoff
