from pathlib import Path

import pytest

from scratch import TINY, copy_repo, set_params


@pytest.fixture
def tiny_repo(tmp_path) -> Path:
    repo = copy_repo(tmp_path / "repo")
    set_params(repo, TINY)
    return repo
