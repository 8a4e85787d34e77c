"""The GRPO stage on tool-using tasks, end to end: ``tools.python.enabled`` gives the env
workers the Python interpreter, ``tools.mcp`` a real MCP server (stdio, the SDK's
``MCPServer``); episodes take several turns (tool call, tool output, answer), each trajectory's
advantage reaches every one of its turns, the weights learn from them, and MCP servers are gone
once the stage has ended. Both tests share the module's Ray.

The model is the tiny Llama rewired into a token-level Markov chain (attention and MLP outputs
zeroed, so each next token depends on the current one only): after the generation prompt's
``\\n`` it writes a tool call (1/2: a python block, or ``<tool_call>{"name":"two"}`` whose
closing tag may be left out at the end of a reply), ``#### 1`` (1/4, a wrong but formatted
answer: reward 0.1) or ``I`` (1/4, reward 0). Episodes therefore take 1 to 3 turns and end with
different rewards, whatever the (random) problems.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from safetensors.torch import load_file

from llmrl.config.grpo import GRPOConfig
from llmrl.models import tiny_model
from llmrl.objectives import MCAdvantage
from llmrl.objectives.from_config import ADVANTAGE_ESTIMATORS
from llmrl.stages.grpo import run_grpo
from tests.support.configs import stage_config
from tests.support.mlflow_runs import metric_values
from tests.support.stages import run_id_of

pytestmark = pytest.mark.slow

CODE = "```python\n\nprint(2)"
"""The model's tool call: an open python block (it runs to the end of the reply)."""
CHAIN: dict[str, dict[str | None, float]] = {
    "\n": {"```": 0.5, "####": 0.25, "I": 0.25},
    "```": {"python": 1.0},
    "python": {"\n\n": 1.0},
    "\n\n": {"print": 1.0},
    "print": {"(": 1.0},
    "(": {"2": 1.0},
    "2": {")": 1.0},
    ")": {None: 1.0},
    "####": {" ": 1.0},
    " ": {"1": 1.0},
    "1": {None: 1.0},
    "I": {None: 1.0},
}
"""Token -> next-token probabilities (None: end of turn)."""
MCP_SERVER = '''
import os
import sys

from mcp.server.mcpserver import MCPServer

open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()  # who ran, for the test
server = MCPServer("numbers", log_level="ERROR")


@server.tool()
def two() -> int:
    """The number two."""
    return 2


server.run("stdio")
'''
MCP_CALL = '<tool_call>{"name":"two"}'
"""The MCP model's tool call."""
MCP_CHAIN: dict[str, dict[str | None, float]] = {
    "\n": {"<": 0.5, "####": 0.25, "I": 0.25},
    "<": {"tool": 1.0},
    "tool": {"_": 1.0},
    "_": {"call": 1.0},
    "call": {">": 1.0},
    ">": {'{"': 1.0},
    '{"': {"name": 1.0},
    "name": {'":"': 1.0},
    '":"': {"two": 1.0},
    "two": {'"}': 1.0},
    '"}': {None: 1.0},
    "####": {" ": 1.0},
    " ": {"1": 1.0},
    "1": {None: 1.0},
    "I": {None: 1.0},
}


def chain_model(tokenizer, chain: dict[str, dict[str | None, float]]) -> torch.nn.Module:
    """The tiny Llama following ``chain`` (untied output layer; logits 25 + log p)."""
    model = tiny_model(tokenizer)
    model.config.tie_word_embeddings = False
    hidden = model.config.hidden_size

    def token(text: str | None) -> int:
        if text is None:
            return tokenizer.eos_token_id
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, (text, ids)
        return ids[0]

    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for state, (text, successors) in enumerate(chain.items()):
            # the final RMSNorm maps this embedding to sqrt(hidden) * e_state
            model.model.embed_tokens.weight[token(text)] = 0.0
            model.model.embed_tokens.weight[token(text), state] = math.sqrt(hidden)
            for successor, probability in successors.items():
                logit = 25.0 + math.log(probability)
                model.lm_head.weight[token(successor), state] = logit / math.sqrt(hidden)
    return model


def save_chain_model(folder: Path, tokenizer, chain: dict[str, dict[str | None, float]]) -> Path:
    chain_model(tokenizer, chain).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    return save_chain_model(tmp_path_factory.mktemp("tool-model"), tokenizer, CHAIN)


@pytest.fixture(scope="module")
def mcp_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    return save_chain_model(tmp_path_factory.mktemp("mcp-model"), tokenizer, MCP_CHAIN)


@pytest.fixture(autouse=True)
def _ray(local_ray):
    """The stage joins the module's local Ray."""


class RecordingAdvantage(MCAdvantage):
    """The runtime's estimator (``advantage.estimator: grpo``), keeping what it hands to the
    trainers."""

    outputs: ClassVar[list] = []

    def __call__(self, td):
        out = super().__call__(td)
        if out is not None:
            type(self).outputs.append(out)
        return out


def run_tool_stage(data: Path, model_dir: Path, mlflow_uri: str, *tools: str, tokens: int):
    """``run_grpo`` of 3 steps of 2 prompts x 4 on the tool model, with the ``tools`` settings."""
    config = stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model_dir}",
        f"tracking.tracking_uri={mlflow_uri}",
        "tracking.log_checkpoint_files=false",
        f"generation.max_new_tokens={tokens}",
        "optimizer.lr=1e-3",
        "loss.masking_strategy=rlhf",
        *tools,
        "tools.max_turns=3",
        "runtime.torch_threads=1",
        output_dir="grpo",
        steps=3,
        prompts_per_step=2,
        num_samples=4,
    )
    return run_grpo(config)


def tool_trajectories(trained: list, call: str) -> dict[int, list]:
    """The trained rows by trajectory, checked: several turns, at most ``tools.max_turns``, and
    every later turn sees ``call`` answered by the tool with ``2``."""
    assert trained, "some groups completed"
    turns: dict[int, list] = {}
    for row in (row for batch in trained for row in batch.unbind(0)):
        turns.setdefault(int(row["traj_id"]), []).append(row)
    assert max(len(t) for t in turns.values()) >= 2, "episodes with several turns"
    assert all(len(t) <= 3 for t in turns.values()), "tools.max_turns"
    for trajectory in turns.values():
        assert [int(row["turn"]) for row in trajectory] == list(range(len(trajectory)))
        assert [bool(row["done"]) for row in trajectory][-1]
        for row in trajectory[1:]:  # later turns see the tool's output of the call before
            chat = row["history"].prompt.to_chats()
            assert [m["role"] for m in chat[-2:]] == ["assistant", "tool"]
            assert chat[-2]["content"] == call and chat[-1]["content"] == "2"
    assert any(float(b["advantage"].abs().max()) > 0 for b in trained), "a reward signal"
    return turns


def assert_learned(result, model_dir: Path, mlflow_uri: str) -> None:
    """Finite losses in MLflow, no skipped step, and weights that moved."""
    losses = metric_values(mlflow_uri, run_id_of(result.final_checkpoint), "loss")
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert result.skipped_steps == 0
    start = load_file(model_dir / "model.safetensors")
    final = load_file(Path(result.final_checkpoint) / "model.safetensors")
    assert set(final) == set(start)
    assert max(float((final[k] - start[k]).abs().max()) for k in start) > 0, "weights moved"


def test_grpo_trains_multi_turn_python_tool_episodes(
    arithmetic_data, tool_model_dir, mlflow_uri, monkeypatch
):
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "grpo", RecordingAdvantage)
    monkeypatch.setattr(RecordingAdvantage, "outputs", [])
    result = run_tool_stage(
        arithmetic_data,
        tool_model_dir,
        mlflow_uri,
        "tools.python.enabled=true",
        "tools.python.timeout_s=10",
        tokens=10,
    )
    trained = RecordingAdvantage.outputs
    tool_trajectories(trained, CODE)
    # the advantage: each trajectory's final reward against its group's, on every turn
    for batch in trained:
        by_group: dict[int, dict[int, list]] = {}
        for row in batch.unbind(0):
            by_group.setdefault(int(row["group_id"]), {}).setdefault(
                int(row["traj_id"]), []
            ).append(row)
        for trajectories in by_group.values():
            assert len(trajectories) == 4
            final = torch.stack([t[-1]["reward"] for t in trajectories.values()])
            std = final.std(correction=0)
            expected = (final - final.mean()) / (std + 1e-6) if std > 0 else final * 0
            for trajectory, value in zip(trajectories.values(), expected.tolist(), strict=True):
                # the estimator's own float32 formula, in another order: a few roundings
                # of values <= ~2 (<= 1e-6)
                assert [float(row["advantage"]) for row in trajectory] == pytest.approx(
                    [value] * len(trajectory), abs=1e-5
                )
    assert_learned(result, tool_model_dir, mlflow_uri)


def _gone(pid: int, within_s: float) -> bool:
    """Whether ``pid`` exited (a zombie counts: its parent, the env worker, was killed)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_grpo_trains_multi_turn_mcp_tool_episodes(
    arithmetic_data, mcp_model_dir, mlflow_uri, monkeypatch, tmp_path
):
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "grpo", RecordingAdvantage)
    monkeypatch.setattr(RecordingAdvantage, "outputs", [])
    script = tmp_path / "numbers_server.py"
    script.write_text(MCP_SERVER)
    pids = tmp_path / "pids"
    pids.mkdir()
    result = run_tool_stage(
        arithmetic_data,
        mcp_model_dir,
        mlflow_uri,
        "tools.mcp.enabled=true",
        f"tools.mcp.servers=[{{name: numbers, command: {sys.executable}, "
        f"args: [{script}, {pids}], timeout_s: 10}}]",
        tokens=12,
    )
    turns = tool_trajectories(RecordingAdvantage.outputs, MCP_CALL)
    for trajectory in turns.values():  # the server's tools are listed in the system prompt
        first = trajectory[0]["history"].prompt.to_chats()
        assert first[0]["role"] == "system" and '"name": "two"' in first[0]["content"]
    assert_learned(result, mcp_model_dir, mlflow_uri)

    # the env workers started the server; with the stage over, none is left running
    started = [int(name) for name in os.listdir(pids)]
    assert started, "the env workers started the MCP server"
    assert all(_gone(pid, within_s=15) for pid in started), "servers stopped with the stage"
