"""``tools.mcp`` in a stage config: MCP servers over stdio (``command``) or streamable HTTP
(``url``), validated with errors that name the field."""

from __future__ import annotations

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import ConfigError
from tests.support.configs import stage_config


def _config(*overrides: str) -> GRPOConfig:
    return stage_config(GRPOConfig, "data.path=prepared", *overrides)


def test_mcp_is_off_by_default():
    tools = _config().tools
    assert not tools.mcp.enabled and tools.mcp.servers == [] and not tools.enabled


def test_stdio_and_http_servers():
    tools = _config(
        "tools.mcp.enabled=true",
        "tools.mcp.servers=[{name: calc, command: python, args: [calc.py], env: {A: '1'}, "
        "timeout_s: 2.5}, {name: web, url: 'https://example.org/mcp'}]",
        "tools.mcp.max_calls=2",
        "tools.mcp.max_restarts=0",
    ).tools
    assert tools.enabled, "an MCP tool turns the tools (multi-turn episodes) on"
    calc, web = tools.mcp.servers
    assert (calc.command, calc.args, calc.env, calc.timeout_s) == (
        "python",
        ["calc.py"],
        {"A": "1"},
        2.5,
    )
    assert (web.url, web.command, web.timeout_s) == ("https://example.org/mcp", None, 30.0)
    assert (tools.mcp.max_calls, tools.mcp.max_restarts) == (2, 0)
    # servers listed but not enabled: off
    assert not _config("tools.mcp.servers=[{name: calc, command: python}]").tools.enabled


def test_python_and_mcp_together():
    tools = _config(
        "tools.python.enabled=true",
        "tools.mcp.enabled=true",
        "tools.mcp.servers=[{name: calc, command: python}]",
    ).tools
    assert tools.python.enabled and tools.mcp.enabled and tools.enabled


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["tools.mcp.enabled=true"], "tools.mcp: `servers` is empty"),
        (
            ["tools.mcp.servers=[{name: calc}]"],
            "tools.mcp.servers[0]: server 'calc' needs `command` (a stdio server) or `url`",
        ),
        (
            ["tools.mcp.servers=[{name: calc, command: python, url: 'http://h/mcp'}]"],
            "tools.mcp.servers[0]: server 'calc' has both `command` and `url`",
        ),
        (
            ["tools.mcp.servers=[{name: calc, url: 'http://h/mcp', args: [x], env: {A: b}}]"],
            "tools.mcp.servers[0]: server 'calc': `args`, `env` only apply to a stdio server",
        ),
        (
            ["tools.mcp.servers=[{name: calc, url: 'ftp://h'}]"],
            "tools.mcp.servers[0]: server 'calc': `url` must start with http:// or https://",
        ),
        (
            [
                "tools.mcp.servers=[{name: a, command: x}, {name: b, command: y}, {name: a, url: 'http://h'}]"
            ],
            "tools.mcp: servers[0] and servers[2] are both named 'a'",
        ),
        (["tools.mcp.servers=[{command: x}]"], "tools.mcp.servers[0].name: Field required"),
        (["tools.mcp.servers=[{name: 'a b', command: x}]"], "tools.mcp.servers[0].name: String"),
        (
            ["tools.mcp.servers=[{name: a, command: x, timeout_s: 0}]"],
            "tools.mcp.servers[0].timeout_s: Input should be greater than 0",
        ),
        (
            ["tools.mcp.servers=[{name: a, command: x, timeout: 3}]"],
            "unknown key 'tools.mcp.servers[0].timeout'",
        ),
        (["tools.mcp.max_calls=0"], "tools.mcp.max_calls: Input should be greater than"),
        (["tools.mcp.start_timeout_s=0"], "tools.mcp.start_timeout_s: Input should be greater"),
        (["tools.mcp.max_restarts=-1"], "tools.mcp.max_restarts: Input should be greater"),
        (["tools.mcp.enabled=maybe"], "tools.mcp.enabled: Input should be a valid boolean"),
        (["tools.mcp.server=[]"], "unknown key 'tools.mcp.server'"),
    ],
)
def test_bad_mcp_settings_name_their_field(overrides, message):
    with pytest.raises(ConfigError) as error:
        _config(*overrides)
    assert message in str(error.value)
