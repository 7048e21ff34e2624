"""The sweep of dead sky.Container pools' host folders (no container runtime needed): it takes
only folders of this user, so a pool run as root leaves other users' pool folders alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward.providers.container import _sweep_folders

NOBODY = 65534


class _NoContainers:
    """A runtime whose pools have no container left (they removed themselves)."""

    def running(self, label_value: str) -> dict[str, bool]:
        return {}


@pytest.fixture
def folders() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for folder in made:
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _old(folder: Path) -> Path:
    then = time.time() - 3600
    os.utime(folder, (then, then), follow_symlinks=False)
    return folder


def test_a_root_pool_sweeps_only_its_own_users_folders(folders: list[Path]) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (to be the root pool) and setpriv (to be another user)")
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.gettempdir())
    theirs = tmp / f"sky-ctr-{tag}a-theirs"
    # Another user's pool folder, made by that user, with a file in it.
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    "sh", "-c", f"mkdir -m 700 {theirs} && echo kept > {theirs}/node.sock"],
                   check=True, cwd="/")
    folders.append(theirs)
    _old(theirs)
    target = tmp / f"skyward-sweep-target-{tag}"
    target.mkdir()
    (target / "precious").write_text("kept")
    folders.append(target)
    link = tmp / f"sky-ctr-{tag}b-link"
    link.symlink_to(target)
    folders.append(link)
    _old(link)
    mine = _old(Path(tempfile.mkdtemp(prefix=f"sky-ctr-{tag}c-")))
    folders.append(mine)

    _sweep_folders(_NoContainers())  # type: ignore[arg-type]

    assert not mine.exists()  # this user's dead pool: swept
    assert (theirs / "node.sock").read_text().strip() == "kept", "another user's pool folder was removed"
    assert (target / "precious").read_text() == "kept"
