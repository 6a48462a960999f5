"""TFServing's test artifacts kept in the repository are the upstream files, unmodified.

tfserving-testdata/BLOBS lists every file with its git blob id at the tensorflow/serving
commit its README names; a file changed, added or lost here fails this test (the tier's
expectations are TFServing's own only while the files are).
"""

from __future__ import annotations

import hashlib
import pathlib

from conformance_support import TESTDATA, TESTDATA_ROOT


def git_blob_id(path: pathlib.Path) -> str:
    """The id git gives the file's content (SHA-1 of ``blob <size>\\0<content>``)."""
    content = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def test_every_file_is_the_upstream_one_and_none_is_added() -> None:
    lines = (TESTDATA_ROOT / "BLOBS").read_text().splitlines()
    listed = {path: blob for blob, path in (line.split(" ", 1) for line in lines)}
    found = {str(p.relative_to(TESTDATA)): git_blob_id(p)
             for p in sorted(TESTDATA.rglob("*")) if p.is_file()}
    assert len(listed) == 42
    assert found == listed


def test_the_license_is_kept_beside_them() -> None:
    text = (TESTDATA_ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    # the LICENSE file of tensorflow/serving at the README's commit, byte for byte
    assert git_blob_id(TESTDATA_ROOT / "LICENSE") == "afb00ed7ac3af269146924bbea55c62df3a00fd1"
