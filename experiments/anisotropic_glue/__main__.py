"""`python -m experiments.anisotropic_glue`: see `command_line.py`."""

from experiments.anisotropic_glue.command_line import main

if __name__ == "__main__":
    main()
