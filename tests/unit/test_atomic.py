"""The one atomic-write helper: readers see the old or the new content, never a part; failures leave no trace."""

import json
import os

import pytest

from engine.io import atomic


def test_files_are_replaced_whole_and_temporaries_removed(tmp_path):
    dest = tmp_path / "sub" / "state.json"
    atomic.write_json(dest, {"v": 1})
    assert json.loads(dest.read_text()) == {"v": 1}
    atomic.write_json(dest, {"v": 2}, fsync=False)
    assert json.loads(dest.read_text()) == {"v": 2}
    with pytest.raises(TypeError):
        atomic.write_json(dest, {"v": object()})
    assert json.loads(dest.read_text()) == {"v": 2}
    assert sorted(p.name for p in dest.parent.iterdir()) == ["state.json"]


def test_a_failing_writer_leaves_the_old_file(tmp_path):
    dest = tmp_path / "f.txt"
    atomic.write_text(dest, "old")
    with pytest.raises(RuntimeError), atomic.atomic_path(dest) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash")
    assert dest.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]


def test_directories_publish_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "v1"
    with atomic.atomic_path(dest, directory=True, replace=False) as tmp:
        (tmp / "a").write_text("1")
        assert not dest.exists()
    assert (dest / "a").read_text() == "1"
    with pytest.raises(FileExistsError):
        with atomic.atomic_path(dest, directory=True, replace=False):
            pass
    with atomic.atomic_path(dest, directory=True) as tmp:  # replace: the old directory goes
        (tmp / "b").write_text("2")
    assert sorted(os.listdir(dest)) == ["b"] and os.listdir(tmp_path) == ["v1"]
    with pytest.raises(RuntimeError), atomic.atomic_path(tmp_path / "v2", directory=True) as tmp:
        (tmp / "x").write_text("half")
        raise RuntimeError("crash")
    assert os.listdir(tmp_path) == ["v1"]
