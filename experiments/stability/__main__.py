"""`python -m experiments.stability`: see `measurement.py`."""

from experiments.stability.measurement import main

if __name__ == "__main__":
    main()
