"""Starts N local processes that train together, as a cluster manager would.

For trying multi-process training on one machine (tests, a laptop): each
process runs the same command with the `KERAS_DISTRIBUTION_*` variables that
`keras_isobn.distribution.join_cluster()` reads, the coordinator (process 0)
on a free port of 127.0.0.1.

```
python -m keras_isobn.launch --processes 2 --devices 2 -- \\
    python recipes/glue.py --distribution multi_worker --output-dir runs/mw
```

Each line of output is prefixed with the process's rank. As soon as a
process fails, the launcher stops the others (SIGKILL) and exits with its
status (`128 + n` for a process killed by signal `n`; 124 after
`--timeout`); with 0 when all succeed. On several hosts, a cluster manager
(or a shell on each host) sets the variables instead; see docs/guides/distribution.md.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ["environments", "free_port", "launch", "main"]


def free_port(host="127.0.0.1"):
    """A TCP port of `host` that no process listens on (at the time)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def environments(processes, devices=None, port=None, base=None):
    """The environment of each of `processes` local processes.

    Args:
        processes: Integer `>= 1`, the number of processes.
        devices: Optional integer `>= 1`: split each process's CPU into
            this many devices (`--xla_force_host_platform_device_count`).
        port: The coordinator's port on 127.0.0.1. Defaults to a free one.
        base: The environment to extend. Defaults to `os.environ`.

    Returns:
        A list of `processes` dicts.
    """
    base = dict(os.environ if base is None else base)
    address = f"127.0.0.1:{port or free_port()}"
    if devices:
        flags = base.get("XLA_FLAGS", "")
        base["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={devices}"
        ).strip()
    return [
        dict(
            base,
            KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
            KERAS_DISTRIBUTION_NUM_PROCESSES=str(processes),
            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
        )
        for index in range(processes)
    ]


def launch(command, processes, devices=None, timeout=None):
    """Runs `command` in `processes` local processes of one cluster.

    Args:
        command: The command, a list of strings.
        processes: Integer `>= 1`.
        devices: Optional integer, CPU devices per process.
        timeout: Optional seconds after which all processes are stopped.

    Returns:
        The exit status: `0` if every process succeeded, else that of a
        failed one (`128 + signal` if killed by a signal), the others
        stopped as soon as it was seen; `124` after `timeout`.
    """
    started = [
        subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        for env in environments(processes, devices)
    ]
    copiers = [
        threading.Thread(target=_copy, args=(rank, process.stdout))
        for rank, process in enumerate(started)
    ]
    for copier in copiers:
        copier.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    status = 0
    try:
        while True:
            codes = [process.poll() for process in started]
            failed = [code for code in codes if code]
            if failed or None not in codes:
                status = _status(failed[0]) if failed else 0
                break
            if deadline and time.monotonic() > deadline:
                status = 124
                break
            time.sleep(0.05)
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
        for process in started:
            process.wait()
        for copier in copiers:
            copier.join()
    return status


def _status(code):
    return 128 - code if code < 0 else code


def _copy(rank, stream):
    for line in stream:
        sys.stdout.write(f"[{rank}] {line}")
        sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_isobn.launch",
        description="Run a command in N local processes of one cluster "
        "(coordinator on 127.0.0.1), as a cluster manager would.",
    )
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--devices", type=int, help="CPU devices per process.")
    parser.add_argument("--timeout", type=float, help="Seconds, then stop.")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if args.processes < 1 or (args.devices is not None and args.devices < 1):
        parser.error("--processes and --devices must be >= 1.")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return launch(command, args.processes, args.devices, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
