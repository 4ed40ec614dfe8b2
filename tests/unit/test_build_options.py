"""``trainer build`` refuses bad options before any work, naming the option (exit 2 on the command line).

A collection name becomes a folder under the index root, so a path (``../../esc``, ``a/b``) would write an index
outside it or into nested folders: it is refused like the registry commands refuse it.
"""

from __future__ import annotations

import pytest

from tests.conftest import SCIFACT
from trainer.build import BuildOptions, build_index
from trainer.config import TrainerSettings


class _Dimension:
    dimension = 384  # build_index checks options against the encoder's dimension before it encodes anything


@pytest.mark.parametrize("options, message", [
    ({"collection": "../../esc"}, "collection name '../../esc' is not a plain name"),
    ({"collection": "bad/name"}, "is not a plain name"),
    ({"collection": ".hidden"}, "is not a plain name"),
    ({"collection": "x" * 129}, "is not a plain name"),
    ({"m0": 0}, "--m0 must be in [1, 384]"),
    ({"m0": 385}, "--m0 must be in [1, 384]"),
    ({"shortlist": -1}, "--shortlist must be at least 1"),
    ({"calibration_threads": 0}, "--calibration-threads must be in [1, 256]"),
])
def test_bad_options_are_refused_before_any_work(tmp_path, options, message):
    settings = TrainerSettings(home=tmp_path / "home", redis_url=None).resolved()
    with pytest.raises(ValueError) as got:
        build_index(BuildOptions(dataset=SCIFACT, rotation="pca", **options), settings, _Dimension())
    assert message in str(got.value)
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.npy"))
    assert not (tmp_path / "esc").exists()


def test_a_dataset_folder_named_after_no_plain_name_asks_for_collection(tmp_path):
    folder = tmp_path / "my corpus"
    folder.mkdir()
    settings = TrainerSettings(home=tmp_path / "home", redis_url=None).resolved()
    with pytest.raises(ValueError, match="give --collection"):
        build_index(BuildOptions(dataset=folder, rotation="pca"), settings, _Dimension())


def test_a_file_given_as_the_dataset_is_named_a_file(tmp_path):
    settings = TrainerSettings(home=tmp_path / "home", redis_url=None).resolved()
    with pytest.raises(FileNotFoundError, match="is a file, not a BEIR folder"):
        build_index(BuildOptions(dataset=SCIFACT / "corpus.jsonl.gz", collection="c", rotation="pca"), settings,
                    _Dimension())
