"""A package index of our own for the record tests: wheels of a tiny package built here, in the
test, served as a PEP 503 simple index from a folder (file://) or over HTTP on an address the
SSH test hosts can reach."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

NAME = "skyprobe"


def build_wheel(folder: Path, version: str) -> Path:
    """skyprobe-VERSION: one module whose VERSION says which one is installed."""
    dist = f"{NAME}-{version}.dist-info"
    files = {
        f"{NAME}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    path = folder / f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arc, data in files.items():
            zf.writestr(arc, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


class Index:
    """``root/simple/skyprobe/`` with the wheels published so far (``publish(version)``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions: list[str] = []
        (root / "simple" / NAME).mkdir(parents=True)
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return (self.root / "simple").as_uri()

    def publish(self, version: str) -> None:
        wheel = build_wheel(self.root / "simple" / NAME, version)
        self.versions.append(version)
        self._pages()
        assert wheel.exists()

    def withdraw(self, version: str) -> None:
        """Take a version off the index (what a yank or a removal looks like to an installer)."""
        self.versions.remove(version)
        (self.root / "simple" / NAME / f"{NAME}-{version}-py3-none-any.whl").unlink()
        self._pages()

    def _pages(self) -> None:
        folder = self.root / "simple" / NAME
        links = []
        for v in self.versions:
            w = folder / f"{NAME}-{v}-py3-none-any.whl"
            links.append(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>')
        (folder / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
        (self.root / "simple" / "index.html").write_text(f'<a href="{NAME}/">{NAME}</a>\n')

    def serve(self, address: str) -> str:
        """Serve the index over HTTP on ``address`` (a free port); returns its simple/ URL."""
        root = str(self.root)

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                super().__init__(*args, directory=root, **kwargs)

            def log_message(self, *args):  # type: ignore[no-untyped-def]
                pass

        self._server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return f"http://{address}:{self._server.server_address[1]}/simple"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join()
