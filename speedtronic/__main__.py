"""``python -m speedtronic``: the same as the ``speedtronic`` command."""

from speedtronic.cli.app import main

if __name__ == "__main__":
    main()
