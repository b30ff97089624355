"""`python -m schedlang`: the `schedlang` command, for a Python whose scripts are not on PATH."""

from schedlang.cli import main

if __name__ == "__main__":
    main(prog_name="python -m schedlang")
