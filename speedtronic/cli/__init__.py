"""The ``speedtronic`` command line: Typer commands and Rich rendering.

The only package that imports typer or rich. Heavy imports (torch) stay inside command bodies
so ``speedtronic --help`` is instant.
"""
