"""`make demo` streams the deploy's progress as it goes (per rig, per operation, with elapsed time),
not its output at the end: the first line arrives while the deploy is still running."""

from __future__ import annotations

import io
import queue
import sys
import textwrap
import threading
from pathlib import Path

from rigfleet_sandbox.demo import Progress, stream

# A deploy that logs like pyinfra, then waits for the test before it goes on and finishes.
FAKE_DEPLOY = textwrap.dedent("""\
    import pathlib, sys, time
    release = pathlib.Path(sys.argv[1])
    print("--> Loading config...")
    print("    [rig-01] \\x1b[32mConnected\\x1b[0m")
    while not release.exists():
        time.sleep(0.05)
    print("--> Starting operation: \\x1b[1mInstall packages\\x1b[0m (nvidia-open)")
    print("    [rig-01] \\x1b[32mSuccess\\x1b[0m")
    sys.exit(3)
""")


class Lines(io.TextIOBase):
    """An output stream handing each printed line to the test as it is printed."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.partial = ""

    def write(self, text: str) -> int:
        *done, self.partial = (self.partial + text).split("\n")
        for line in done:
            self.lines.put(line)
        return len(text)


def test_the_first_progress_line_comes_before_the_deploy_finishes(tmp_path: Path) -> None:
    script, release = tmp_path / "fake_deploy.py", tmp_path / "go-on"
    script.write_text(FAKE_DEPLOY, encoding="utf-8")
    out, result = Lines(), dict[str, tuple[int, str]]()
    worker = threading.Thread(target=lambda: result.update(
        done=stream([sys.executable, str(script), str(release)], tmp_path, {}, out)))  # type: ignore[arg-type]
    worker.start()
    try:
        first = out.lines.get(timeout=120)  # a safety net only: the fake waits for the release below
        assert "Loading config..." in first and first.startswith("[")
        assert "done" not in result and not release.exists()  # the deploy has not finished: it cannot
        assert "rig-01" in out.lines.get(timeout=120)
    finally:
        release.touch()
        worker.join(timeout=120)
    code, output = result["done"]
    assert code == 3 and "Install packages" in output
    rest = [out.lines.get_nowait() for _ in range(out.lines.qsize())]
    assert any("rig-01: Install packages: Success" in line for line in rest), rest


def test_a_result_line_names_rig_operation_result_and_time() -> None:
    ticks = iter([0.0, 1.0, 4.0, 6.5])
    progress = Progress(clock=lambda: next(ticks))
    started = progress.line("--> Starting operation: \x1b[1mRender compose\x1b[0m (rig-02)\n")
    assert started == "[   1.0s] Render compose"
    assert progress.line("    [rig-02] No changes\n") == "[   4.0s]   rig-02: Render compose: No changes (3.0 s)"
    assert progress.line("   \n") is None
    assert progress.line("--> Results:\n") == "[   6.5s] Results:"
