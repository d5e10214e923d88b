"""`python -m experiments.anisotropy_lab`: see `command_line.py`."""

from experiments.anisotropy_lab.command_line import main

if __name__ == "__main__":
    main()
