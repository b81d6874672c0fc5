"""`python -m parity`: see `parity._cli`."""

from parity._cli import script

if __name__ == "__main__":
    script()
