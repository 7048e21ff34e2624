from __future__ import annotations

import pytest

pytest.importorskip("pulumi")

from stackfakes import Recorder, pulumi


@pytest.fixture
def mocks() -> Recorder:
    """Fresh Pulumi mocks for one test (programs declare resources into them)."""
    recorder = Recorder()
    pulumi.runtime.set_mocks(recorder, preview=False)
    return recorder
