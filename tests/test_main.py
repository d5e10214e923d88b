import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(__file__))


def test_demo_prints_its_result_and_nothing_else():
    # As a new user runs it: no TF_CPP_MIN_LOG_LEVEL of one's own.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", "keras_isobn"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # No cuInit, oneDNN or AVX line.
    lines = done.stdout.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == [
        "input",
        "IsoBN output",
    ]
