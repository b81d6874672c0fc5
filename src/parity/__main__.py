"""`python -m parity`: see `parity.cli`."""

from parity.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
