"""Archive extraction keeps the volume the boundary whatever the member order, and every
failure is typed: links that only escape once a later member lands, hard links to missing
members, oversized extended headers, too many members; and the same results where Python has
no ``data`` extraction filter (before 3.11.4, as in the images)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from cdi.api.errors import InvalidImage, UnsafeImage
from datapath.decode.archive import data_filtered, extract_tar
from datapath.decode.tarbounds import MAX_HEADER_BYTES


def _tar(*members: tuple[str, bytes, str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, kind, link, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def _extract(image: bytes, dest: Path, **kwargs: int) -> int:
    dest.mkdir(exist_ok=True)
    return extract_tar(iter([image]), str(dest), 1 << 20, **kwargs)


def test_a_link_that_escapes_only_after_a_later_member_is_refused_and_removed(
    tmp_path: Path,
) -> None:
    # "a -> b/.." is inside while b is missing; "b -> ." then makes a resolve to dest/..
    image = _tar(("a", tarfile.SYMTYPE, "b/..", b""), ("b", tarfile.SYMTYPE, ".", b""))
    dest = tmp_path / "vol"
    with pytest.raises(UnsafeImage, match="outside the volume"):
        _extract(image, dest)
    assert not os.path.lexists(dest / "a")
    for name in os.listdir(dest):
        resolved = os.path.realpath(dest / name)
        assert resolved.startswith(str(dest.resolve()))


def test_links_that_stay_inside_are_kept(tmp_path: Path) -> None:
    image = _tar(
        ("dir/", tarfile.DIRTYPE, "", b""),
        ("dir/f", tarfile.REGTYPE, "", b"data"),
        ("lib", tarfile.SYMTYPE, "dir", b""),
        ("dir/up", tarfile.SYMTYPE, "../dir/f", b""),
    )
    assert _extract(image, tmp_path / "vol") == 4
    assert (tmp_path / "vol" / "dir" / "up").read_bytes() == b"data"
    assert os.path.islink(tmp_path / "vol" / "lib")


def test_a_hard_link_to_a_missing_member_is_a_typed_error(tmp_path: Path) -> None:
    image = _tar(("h", tarfile.LNKTYPE, "nowhere/file", b""))
    with pytest.raises(InvalidImage, match="not in the archive"):
        _extract(image, tmp_path / "vol")


def test_an_oversized_extended_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 4 << 30  # declares 4 GiB, sends none
    image = header.tobuf(format=tarfile.USTAR_FORMAT) + bytes(1024)
    with pytest.raises(UnsafeImage, match=f"{MAX_HEADER_BYTES}-byte limit"):
        _extract(image, tmp_path / "vol")


def test_the_member_count_is_bounded(tmp_path: Path) -> None:
    image = _tar(*[(f"f{i}", tarfile.REGTYPE, "", b"x") for i in range(5)])
    with pytest.raises(UnsafeImage, match="more than 3 members"):
        _extract(image, tmp_path / "vol", max_members=3)


def test_a_name_with_a_nul_byte_is_refused(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("plain")
        info.pax_headers = {"path": "a\0b"}
        archive.addfile(info)
    with pytest.raises(UnsafeImage, match="NUL byte"):
        _extract(out.getvalue(), tmp_path / "vol")


def _moded_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, kind, mode, link, data in (
            ("dir", tarfile.DIRTYPE, 0o777, "", b""),
            ("dir/setuid", tarfile.REGTYPE, 0o4777, "", b"suid"),
            ("dir/tool", tarfile.REGTYPE, 0o755, "", b"#!"),
            ("dir/readonly", tarfile.REGTYPE, 0o444, "", b"ro"),
            ("dir/alias", tarfile.SYMTYPE, 0o777, "tool", b""),
            ("hard", tarfile.LNKTYPE, 0o644, "dir/readonly", b""),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, link, len(data)
            info.uid, info.gid, info.uname, info.gname = 4242, 4242, "someone", "others"
            archive.addfile(info, io.BytesIO(data) if data else None)
    return out.getvalue()


def test_without_pythons_data_filter_the_same_files_and_modes_come_out(tmp_path: Path) -> None:
    """Debian bookworm's Python 3.11.2 (the images') has no ``filter="data"``: the archive's
    own rules give what the filter gives on a newer Python."""
    image = _moded_tar()
    trees = {}
    for builtin in (True, False):
        dest = tmp_path / f"builtin-{builtin}"
        dest.mkdir()
        extract_tar(iter([image]), str(dest), 1 << 20, builtin_filter=builtin)
        trees[builtin] = {
            str(p.relative_to(dest)): (
                p.is_symlink(),
                os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None,
                None if p.is_symlink() or p.is_dir() else stat.S_IMODE(p.stat().st_mode),
            )
            for p in sorted(dest.rglob("*"))
        }
        assert not stat.S_IMODE((dest / "dir").stat().st_mode) & 0o022
        assert (dest / "hard").stat().st_ino == (dest / "dir" / "readonly").stat().st_ino
    assert trees[False] == trees[True]
    assert trees[False]["dir/setuid"][2] == 0o755  # no setuid, no group/other write
    assert trees[False]["dir/readonly"][2] == 0o644  # owner may write, no execute


def test_the_fallback_filter_refuses_what_the_data_filter_refuses(tmp_path: Path) -> None:
    dest = tmp_path / "vol"
    dest.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", dest / "planted")

    def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        return info

    with pytest.raises(UnsafeImage, match="outside the volume"):
        data_filtered(member("planted/file"), str(dest))
    with pytest.raises(UnsafeImage, match="outside the volume"):
        data_filtered(member("l", tarfile.SYMTYPE, "/etc/passwd"), str(dest))
    with pytest.raises(UnsafeImage, match="outside the volume"):
        data_filtered(member("l", tarfile.SYMTYPE, "planted"), str(dest))
    with pytest.raises(UnsafeImage, match="not a file, directory or link"):
        data_filtered(member("pipe", tarfile.FIFOTYPE), str(dest))
    kept = data_filtered(member("ok", tarfile.SYMTYPE, "file"), str(dest))
    assert (kept.uid, kept.uname) == (os.geteuid(), "")
