"""``python -m plait``: the ``plait`` command line."""

from plait.cli import main

if __name__ == "__main__":
    main()
