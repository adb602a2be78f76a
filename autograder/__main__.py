from autograder.cli import main

# Guarded: Dask's worker processes start by importing the main module again.
if __name__ == "__main__":
    raise SystemExit(main())
