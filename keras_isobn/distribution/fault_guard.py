"""Stopping every process of a cluster when one of them stops."""

import contextlib
import os
import select
import socket
import sys
import threading
import traceback

from keras_isobn.distribution.cluster import coordinator_host
from keras_isobn.distribution.cluster import process_count
from keras_isobn.distribution.cluster import process_index

__all__ = ["stop_cluster_on_error"]


@contextlib.contextmanager
def stop_cluster_on_error():
    """Stops every process of the cluster soon after one of them stops.

    A process killed (`SIGKILL`, out of memory) while the others wait for
    it in a collective operation would leave them waiting until JAX's
    heartbeat timeout (100 s) or longer. In the block, a thread in each
    process keeps a connection to the chief: when a process ends before
    leaving its block, the chief sees its connection close, prints an
    error naming it and exits with status 1 at once (`os._exit`), and the
    other processes, seeing the chief's connection close, do the same,
    within a fraction of a second. A process that raises in the block
    prints its error and exits at once too (status 1, or that of a
    `SystemExit`), which stops the others likewise; one that leaves the
    block normally says so to the chief first. Without a cluster the
    block does nothing.

    Why a watchdog of its own rather than JAX's: JAX stops the survivors
    itself, through the heartbeats of its coordination service
    (`jax.distributed.initialize(heartbeat_timeout_seconds=...,
    shutdown_timeout_seconds=...)`, which `keras.distribution.initialize()`
    does not pass on), but by aborting them. Measured with JAX 0.10.2 on
    CPUs (gloo), 2 processes on the loopback, one killed with `SIGKILL`
    while both loop on a cross-process all-gather
    (`experiments/reproductions/jax_heartbeat.py`):

    | Survivor's guard                    | Exits after | Status | Says       |
    |-------------------------------------|-------------|--------|------------|
    | JAX's defaults (100 s, 300 s)       | 97 s        | -6     | C++ trace  |
    | JAX, heartbeat and shutdown 3 s     | 3.2 s       | -6     | C++ trace  |
    | JAX, 3 s, the chief killed          | 0.1 s       | -6     | C++ trace  |
    | `stop_cluster_on_error()` (either)  | 0.1 s       | 1      | who died   |

    The gloo collective fails at once ("Connection reset by peer"), but the
    process then waits for the coordination service, which ends it with
    `SIGABRT` (status -6, a core dump where enabled) and a C++ stack trace
    after "Task 1 heartbeat timeout" among gRPC errors. A status that says
    "failed" rather than "crashed", and a message naming the process that
    stopped, are what a cluster manager and a person rerunning the commands
    need.

    Example:

    ```python
    keras_isobn.distribution.join_cluster()
    with keras_isobn.distribution.stop_cluster_on_error():
        model.fit(...)  # Every process, the same program.
    ```
    """
    if process_count() <= 1:
        yield
        return
    guard = _Watchdog(process_index(), process_count(), coordinator_host())
    try:
        yield
    except BaseException as error:
        guard.stop(error)
    guard.close(done=True)


class _Watchdog:
    """The connections of `stop_cluster_on_error()`: workers to the chief.

    The chief listens on a free port, which a broadcast over the cluster's
    own collectives tells the workers. Each connection carries one message,
    `b"done"`, sent when its process leaves the block normally; a
    connection closed without it (the kernel closes the sockets of a
    killed process) stops the process at the other end.
    """

    def __init__(self, index, count, host):
        from jax.experimental import multihost_utils

        self.index, self.count, self.closing = index, count, False
        server, port = None, 0
        if index == 0:
            server = socket.create_server(("", 0))
            server.listen(count)
            port = server.getsockname()[1]
        port = int(multihost_utils.broadcast_one_to_all(port))
        if index == 0:
            self.peers = {}
            for _ in range(count - 1):
                connection, _ = server.accept()
                peer = int.from_bytes(connection.recv(4), "big")
                self.peers[peer] = connection
            server.close()
        else:
            connection = socket.create_connection((host, port), timeout=60)
            connection.settimeout(None)
            connection.sendall(index.to_bytes(4, "big"))
            self.peers = {0: connection}
        for peer, connection in self.peers.items():
            threading.Thread(
                target=self._watch, args=(peer, connection), daemon=True
            ).start()

    def _watch(self, peer, connection):
        try:
            message = connection.recv(16)
        except OSError:
            message = b""
        if not (message.startswith(b"done") or self.closing):
            self._exit(self._lost(peer), 1)

    def _lost(self, peer):
        what = "the chief" if peer == 0 else "a worker"
        return (
            f"keras_isobn.distribution: process {peer} of the "
            f"{self.count}-process cluster ({what}) stopped before the end "
            f"(killed, or failed); stopping process {self.index} too (exit "
            "status 1) rather than wait for it in a collective. Running "
            "the same commands again resumes from the last saved state."
        )

    def _exit(self, message, status):
        sys.stdout.flush()
        print(message, file=sys.stderr, flush=True)
        os._exit(status)

    def stop(self, error):
        """Ends this process after `error`, naming a lost peer if any."""
        self.closing = True
        # A collective fails too when a peer dies: if one did, say so.
        ready, _, _ = select.select(list(self.peers.values()), [], [], 1.0)
        for peer, connection in self.peers.items():
            if connection in ready and not connection.recv(16, socket.MSG_PEEK):
                self._exit(self._lost(peer), 1)
        status = 1
        if isinstance(error, SystemExit):
            status = error.code if isinstance(error.code, int) else 1
            message = "" if error.code in (None, 0) else str(error.code)
        else:
            message = "".join(traceback.format_exception(error))
        self._exit(
            f"{message}\nkeras_isobn.distribution: process {self.index} "
            f"stops, and so the {self.count}-process cluster.",
            status,
        )

    def close(self, done=False):
        self.closing = True
        for connection in self.peers.values():
            try:
                if done:
                    connection.sendall(b"done")
                connection.close()
            except OSError:
                pass

