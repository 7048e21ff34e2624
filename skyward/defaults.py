"""What the package hands down to the modules below it when it is imported: the default
provider of a Spec that names none (``sky.Local()``). The providers import ``skyward.spec``, so
spec does not import them; ``skyward/__init__.py``, above both, sets the factory here."""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

provider: Callable[[], Any] | None = None
