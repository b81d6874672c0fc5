"""`python -m parity`: see `parity.cli`."""

from parity.cli import script

if __name__ == "__main__":
    script()
