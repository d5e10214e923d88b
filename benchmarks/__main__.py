"""`python -m benchmarks`: runs the suite (see `benchmarks/run.py`)."""

from benchmarks import run

if __name__ == "__main__":
    run.main()
