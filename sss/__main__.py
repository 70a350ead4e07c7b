"""`python -m sss` (also `accelerate launch -m sss fit ...`)."""

from sss.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
