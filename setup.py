"""What pyproject.toml cannot say: a ``.pth`` file at the root of site-packages.

Everything else about the package is in pyproject.toml. ``skyward-joblib.pth`` makes joblib
know the backend name "skyward" in every interpreter of the environment, also in one that
never imports skyward (a worker of joblib's loky backend); skyward/joblib_pth.py makes its
one line and says why. setuptools installs files of packages and modules only, so
``build_py`` is extended to write the file beside them:

* a wheel (``pip install .``, ``python -m build``): into ``build_lib``, whose whole tree
  becomes the wheel's root, which the installer unpacks into site-packages;
* an editable install (``pip install -e .``, what CI runs): setuptools' ``editable_wheel``
  ignores ``build_lib`` (the packages stay in the checkout, named by a path in
  ``__editable__.skyward-*.pth``), and runs ``build_py`` with ``editable_mode`` set. The
  file goes into the folder that ``editable_wheel`` points ``install``'s ``install_lib`` at:
  the root of the editable wheel it builds (where it puts its own namespace ``.pth`` files).
"""

from __future__ import annotations

import logging
from pathlib import Path
from runpy import run_path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# The hook's module, run on its own (it imports nothing of skyward, nor its dependencies).
HOOK = run_path(str(HERE / "skyward" / "joblib_pth.py"))
PTH: str = HOOK["NAME"]


class BuildPyWithPth(build_py):
    """build_py that also writes skyward-joblib.pth (see the module doc)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            root = Path(self.get_finalized_command("install").install_lib)
            if not any(root.glob("*.dist-info")):  # not the editable wheel being assembled
                logging.getLogger(__name__).warning(
                    "skyward: %s is not the root of the editable wheel; %s left out (joblib "
                    "will not know the backend name in interpreters that do not import skyward)",
                    root,
                    PTH,
                )
                return
            where: Path | None = HERE  # skyward stays in the checkout
        else:
            root = Path(self.build_lib)
            where = None  # beside the .pth, in the site-packages the wheel is installed in
        root.mkdir(parents=True, exist_ok=True)
        (root / PTH).write_text(HOOK["pth_text"](where), encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib) / PTH))
        return outputs


setup(cmdclass={"build_py": BuildPyWithPth})
