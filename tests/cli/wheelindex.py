"""A package index of our own for the `skyward install` tests: tiny pure-Python wheels, with
dependencies, built in the test and served as a PEP 503 simple index from a folder (file://),
so the tests need no network and know exactly which versions exist."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def build_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """NAME-VERSION: one module whose VERSION says which one is installed."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{module}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arc, data in files.items():
            zf.writestr(arc, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


class WheelIndex:
    """``root/simple/<name>/`` pages for the wheels published so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.projects: dict[str, list[Path]] = {}

    @property
    def url(self) -> str:
        return (self.root / "simple").as_uri()

    def publish(self, name: str, version: str, *requires: str) -> None:
        folder = self.root / "simple" / name
        self.projects.setdefault(name, []).append(build_wheel(folder, name, version, requires))
        links = [f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>'
                 for w in self.projects[name]]
        (folder / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
        (self.root / "simple" / "index.html").write_text(
            "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(self.projects)))
