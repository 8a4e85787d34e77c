"""Plain helpers that more than one test folder uses: builders, constants, fake objects.

Fixtures are not here: pytest finds the shared ones in ``tests/conftest.py`` and each folder's
own in its ``conftest.py``. A test module imports from its own folder, from here or from
``tests.tolerances``; never from a ``test_*`` module or another folder's conftest
(``tests/test_test_imports.py`` checks). This package's ``__init__`` imports nothing: Ray
actors import :mod:`tests.support.factories` to rebuild factories.
"""
