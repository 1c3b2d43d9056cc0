#!/usr/bin/env python
"""Django's command-line utility for Effectgate, from a checkout (installed: ``effectgate``)."""

from console.cli import main

if __name__ == "__main__":
    main()
