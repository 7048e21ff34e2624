"""A secret in Image.env and a HuggingFace token never reach the log file, the events or the
console, even when a task prints them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SECRET = "s3cr3t-value-9f8e7d"
HF = "hf_TokenValue1234567890"

PROGRAM = textwrap.dedent(f"""
    import os, sys
    import skyward as sky
    from skyward.observe import events as ev

    events = []
    sky.subscribe(events.append)

    @sky.function
    def leak():
        print("api key is", os.environ["API_KEY"])
        print("hf token is", os.environ["HF_TOKEN"], file=sys.stderr)
        raise RuntimeError("failed with " + os.environ["API_KEY"])

    image = sky.Image(env={{"API_KEY": sky.secret("{SECRET}"), "HF_TOKEN": "{HF}"}})
    logging = sky.LogConfig(level="DEBUG", file=sys.argv[1])
    with sky.Compute(nodes=2, image=image, options=sky.Options(console="log", logging=logging)) as pool:
        try:
            leak() @ pool
        except RuntimeError:
            pass
        ev.bus.flush()
    print("EVENTS", repr(events))
""")


def test_secrets_are_redacted_everywhere(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    log_file = tmp_path / "skyward.log"
    out = subprocess.run([sys.executable, str(script), str(log_file)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "api key is ***" in out.stdout and "hf token is ***" in out.stderr  # the task ran
    assert "EVENTS" in out.stdout and "Log(" in out.stdout  # events were captured
    text = log_file.read_text()
    assert "ready" in text and "api key is ***" in text  # the log file has events and output
    for where, content in (("stdout", out.stdout), ("stderr", out.stderr), ("log file", text)):
        assert SECRET not in content, f"secret leaked to {where}"
        assert HF not in content, f"HF token leaked to {where}"
