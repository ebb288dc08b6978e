"""A copy of the checkout as a fresh clone has it (tracked and untracked-not-ignored files, no
build output, no in-place libraries), for tests of what runs on a fresh machine: CI's scripts,
the GPU plan's carried layout."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def copy_clean_tree(dst, *paths: str) -> None:
    """The checkout's files (only those under `paths`, when given) into dst; skips the calling
    test where there is no git checkout to list them."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout: the clean tree is what git tracks")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", *paths], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))
