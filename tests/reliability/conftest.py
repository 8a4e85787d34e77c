"""Fixtures for the reliability suite: faults, bad input and hostile code.

Each test module here keeps its own helpers; shared fixtures live in ``tests/conftest.py``,
``tests/train/conftest.py`` and ``tests/tracking/conftest.py``.
"""
