"""`python -m experiments.isotropy_minilm`: see `command_line.py`."""

from experiments.isotropy_minilm.command_line import main

if __name__ == "__main__":
    main()
