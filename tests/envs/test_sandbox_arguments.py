"""The sandbox's arguments: limits are validated, bad arguments raise in the caller, and
the Python blocks of a reply are found."""

from __future__ import annotations

import pytest

from llmrl.envs.sandbox import SandboxLimits, extract_python_blocks, run_python

pytestmark = pytest.mark.timeout(60)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", -1.0),
        ("timeout_s", float("nan")),
        ("timeout_s", "5"),
        ("timeout_s", True),
        ("memory_mb", 0),
        ("memory_mb", 1.5),
        ("max_output_chars", 0),
        ("max_file_mb", 0),
        ("max_processes", -1),
        ("allow_network", "yes"),
        ("os_sandbox", "off"),
    ],
)
def test_limits_are_validated(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: value})


@pytest.mark.timeout(60)
def test_bad_arguments_raise_in_the_caller() -> None:
    with pytest.raises(TypeError):
        run_python(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run_python("print(1)", {"timeout_s": 1})  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("markdown", "blocks"),
    [
        ("no code here", []),
        ("```python\nprint(1)\n```", ["print(1)"]),
        ("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```\n", ["a = 1", "b = 2"]),
        ("```js\nalert(1)\n```\n```\nplain\n```\n```bash\nls\n```", []),
        ("```Python3 title=x\nx = 1\n\n  y = 2\n```", ["x = 1\n\n  y = 2"]),
        ("```python\nprint(1)```", ["print(1)"]),  # closing fence glued to the code
        ("```python\nfor i in range(3):\n    print(i)", ["for i in range(3):\n    print(i)"]),
        ("  ```python\n  if x:\n      y()\n  ```", ["if x:\n    y()"]),  # indented fence
        ("````python\ns = '```'\n````", ["s = '```'"]),
        ("```python\n```", [""]),
        ("~~~python\nz = 3\n~~~", ["z = 3"]),
    ],
)
def test_extract_python_blocks(markdown: str, blocks: list[str]) -> None:
    assert extract_python_blocks(markdown) == blocks
