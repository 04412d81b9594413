"""`python -m rayslice`: the same command as the `rayslice` console script."""

from rayslice.cli import entry_point

if __name__ == "__main__":
    entry_point()
