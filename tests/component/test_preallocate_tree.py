"""``preallocate_tree``: a filesystem clone's extracted files are allocated whole, on a real
filesystem, without following a link planted in the tree."""

from __future__ import annotations

import os
from pathlib import Path

from datapath.target import preallocate_tree

MiB = 1024 * 1024


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_every_regular_file_is_allocated_and_links_are_not_followed(tmp_path: Path) -> None:
    tree = tmp_path / "data"
    (tree / "sub").mkdir(parents=True)
    disk = tree / "disk.img"
    with open(disk, "wb") as fh:
        fh.truncate(8 * MiB)
        fh.write(b"x" * 4096)
    (tree / "sub" / "empty").touch()
    outside = tmp_path / "outside.img"
    with open(outside, "wb") as fh:
        fh.truncate(8 * MiB)
    (tree / "link.img").symlink_to(outside)
    assert allocated(disk) < MiB

    assert preallocate_tree(str(tree)) == 8 * MiB
    assert allocated(disk) >= 8 * MiB
    assert disk.read_bytes()[:4096] == b"x" * 4096  # the data is kept
    assert allocated(outside) < MiB  # the link's target outside the tree is left alone
