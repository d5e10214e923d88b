"""Runs `recipes/glue.py`, killing itself with SIGKILL at a chosen point.

Usage, from the repository root:

    python -m tests.helpers.kill_worker KILL_POINT RECIPE_ARGS...

With `AUDIT_WRITES=FILE` set, it also records (Python's audit hooks) every
file or folder the process creates, writes, renames or removes under
`--output-dir`, and writes their list to FILE (JSON) when it exits.

KILL_POINT is `none`, or one of (counts are within this process):
- `batch:E:B`: after training batch B of epoch E (both from 0);
- `evaluate:N`: at the start of the N-th whole-dev-set evaluation;
- `write:NAME:N`: during the N-th atomic write of a file named NAME
  (`state.npz`, `best.keras`, `results.json`, ...), once the temporary file
  is written and before it replaces NAME.
"""

import collections
import os
import signal
import sys

import recipes.glue as recipe
from keras_isobn import callbacks
from keras_isobn import files

calls = collections.Counter()


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_after_batch(epoch, batch):
    def on_epoch_begin(self, current, logs=None):
        self.current_epoch = current

    def on_train_batch_end(self, current, logs=None):
        if (self.current_epoch, current) == (epoch, batch):
            die()

    callbacks.TrainingCheckpoint.on_epoch_begin = on_epoch_begin
    callbacks.TrainingCheckpoint.on_train_batch_end = on_train_batch_end


def kill_in_evaluation(count):
    evaluate = callbacks.WholeSetMetrics.evaluate

    def patched(self, model=None):
        calls["evaluate"] += 1
        if calls["evaluate"] == count:
            die()
        return evaluate(self, model)

    callbacks.WholeSetMetrics.evaluate = patched


def kill_while_writing(name, count):
    atomic_write = files.atomic_write

    def patched(path, content):
        if os.path.basename(path) == name:
            calls[name] += 1
            if calls[name] == count:
                # The temporary file written, as `atomic_write` does it...
                stem, extension = os.path.splitext(path)
                temporary = f"{stem}.partial{extension}"
                if isinstance(content, str):
                    with open(temporary, "w") as file:
                        file.write(content[: len(content) // 2])
                else:
                    content(temporary)
                die()  # ... and a kill before it replaces `path`.
        return atomic_write(path, content)

    # Every module that holds the function (imported by name) gets the
    # patched one: the library's and the recipe's.
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(("keras_isobn", "recipes")):
            continue
        if getattr(module, "atomic_write", None) is atomic_write:
            module.atomic_write = patched


WRITE_EVENTS = {
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.link",
    "os.symlink",
    "os.truncate",
    "shutil.rmtree",
    "shutil.copyfile",
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def audit_writes(output_dir, log_path):
    """Records the writes under `output_dir`; lists them in `log_path`."""
    import atexit
    import json

    root = os.path.realpath(output_dir)
    writes = []

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = bool((flags or 0) & WRITE_FLAGS)
            paths = [path] if writing else []
        elif event in WRITE_EVENTS:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes))]
        else:
            return
        for path in paths:
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if isinstance(path, str) and os.path.realpath(
                os.path.abspath(path)
            ).startswith(root):
                writes.append(f"{event} {path}")

    def dump():
        with open(log_path, "w") as file:
            json.dump(writes, file)

    sys.addaudithook(hook)
    atexit.register(dump)


if __name__ == "__main__":
    if os.environ.get("AUDIT_WRITES"):
        argv = sys.argv[2:]
        output_dir = argv[argv.index("--output-dir") + 1]
        audit_writes(output_dir, os.environ["AUDIT_WRITES"])
    kind, *where = sys.argv[1].split(":")
    if kind == "batch":
        kill_after_batch(int(where[0]), int(where[1]))
    elif kind == "evaluate":
        kill_in_evaluation(int(where[0]))
    elif kind == "write":
        kill_while_writing(where[0], int(where[1]))
    recipe.main(sys.argv[2:])
