"""`shielded()`: a signal that comes inside the block lets the block finish and is raised as
`Interrupted` at its end (at the outermost block's end when they nest); outside a block it
interrupts at once. Each case runs in its own process (it signals itself)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import os, signal
    from stalebench.runtime.signals import Interrupted, interruptible, shielded

    seen = []
    try:
        with interruptible():
            {body}
            seen.append("after")
    except Interrupted as e:
        seen.append(f"interrupted {{e.signum}}")
    print(" ".join(seen))
    """
)
KILL = "os.kill(os.getpid(), signal.SIGINT)"


def run(body: str) -> str:
    program = PROGRAM.format(body=textwrap.indent(textwrap.dedent(body), " " * 8).strip())
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "body, expected",
    [
        # no shield: the signal interrupts where it lands
        (f"{KILL}\nseen.append('inside')", "interrupted 2"),
        # shielded: the block runs to its end, then the run is interrupted
        (
            f"with shielded():\n    {KILL}\n    seen.append('inside')\nseen.append('past')",
            "inside interrupted 2",
        ),
        # nested: held until the outermost block ends
        (
            f"with shielded():\n    with shielded():\n        {KILL}\n"
            "        seen.append('inner')\n    seen.append('outer')\nseen.append('past')",
            "inner outer interrupted 2",
        ),
        # a block without a signal raises nothing
        ("with shielded():\n    seen.append('inside')", "inside after"),
    ],
    ids=["unshielded", "shielded", "nested", "quiet"],
)
def test_a_signal_inside_a_shielded_block_waits_for_its_end(body: str, expected: str) -> None:
    assert run(body) == expected


@pytest.mark.timeout(90)
def test_an_error_inside_the_block_gives_way_to_the_held_signal() -> None:
    body = f"with shielded():\n    {KILL}\n    raise RuntimeError('torch.func state')"
    assert run(body) == "interrupted 2"
