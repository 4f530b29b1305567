"""Artifact refs and manifests: parsing, validation, canonical form."""

from __future__ import annotations

import pytest

from aicluster.artifacts import (
    FileEntry,
    Manifest,
    ManifestError,
    RefError,
    parse_ref,
)
from aicluster.artifacts.manifest import check_files, scan_folder
from aicluster.artifacts.names import check_tag

SHA = "a" * 64


@pytest.mark.parametrize(
    "text, team, name, version, tag",
    [
        ("vision/llama-ft:3", "vision", "llama-ft", 3, None),
        ("vision/ckpt-run42:latest", "vision", "ckpt-run42", None, "latest"),
        ("vision/data.v2:best", "vision", "data.v2", None, "best"),
        ("model", "dflt", "model", None, None),
    ],
)
def test_refs_parse(text, team, name, version, tag):
    ref = parse_ref(text, default_team="dflt")
    assert (ref.team, ref.name, ref.version, ref.tag) == (team, name, version, tag)
    assert str(parse_ref(str(ref))) == str(ref)


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "empty"),
        ("model", "no team"),
        ("Team/x", "team 'Team'"),
        ("t/Bad_Name", "artifact name 'Bad_Name'"),
        ("t/x:", "nothing after ':'"),
        ("t/x:0", "versions start at 1"),
        ("t/x:bad tag", "tag 'bad tag'"),
    ],
)
def test_bad_refs_name_the_part(text, says):
    with pytest.raises(RefError, match=says):
        parse_ref(text)


def test_latest_is_reserved_and_tags_are_not_numbers():
    with pytest.raises(RefError, match="reserved"):
        check_tag("latest")
    with pytest.raises(RefError):
        check_tag("12")


@pytest.mark.parametrize("path", ["/abs", "../up", "a/../b", "a//b", "./a", ""])
def test_manifest_paths_stay_inside(path):
    with pytest.raises(ManifestError, match="relative"):
        check_files([FileEntry(path, 1, SHA)])


def test_manifest_rejects_duplicates_and_bad_digests():
    with pytest.raises(ManifestError, match="twice"):
        check_files([FileEntry("a", 1, SHA), FileEntry("a", 1, SHA)])
    with pytest.raises(ManifestError, match="sha256"):
        check_files([FileEntry("a", 1, "xyz")])


def test_manifest_json_is_canonical_and_round_trips():
    files = check_files([FileEntry("b", 2, SHA), FileEntry("a", 1, "b" * 64)])
    m = Manifest("t", "m", "model", 1, files, {"k": "v"}, "job-1", 5.0, "alice")
    assert [f.path for f in m.files] == ["a", "b"]
    assert Manifest.from_json(m.to_json()) == m
    assert m.to_json() == Manifest.from_json(m.to_json()).to_json()


def test_scan_skips_links_leaving_the_folder(tmp_path):
    (tmp_path / "out.txt").write_text("outside")
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    (root / "inside").symlink_to(root / "d" / "f")
    (root / "escape").symlink_to(tmp_path / "out.txt")
    paths = [e.path for e, _ in scan_folder(root)]
    assert paths == ["d/f", "inside"]
