"""Benchmark worker in the peers' venv: TorchRL's ``TransformersWrapper`` generating rollouts.

Same request as llmrl's rollout worker: ``samples`` sampled responses per chat, ``new_tokens``
at most, with sampling log-probs, from history input.
"""

from __future__ import annotations

from typing import Any

import torch
from harness import serve


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    import torchrl
    from tensordict import TensorDict
    from torchrl.data.llm import History
    from torchrl.modules.llm import ChatHistory, TransformersWrapper
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_grad_enabled(False)
    tokenizer = AutoTokenizer.from_pretrained(options["model"])
    model = AutoModelForCausalLM.from_pretrained(options["model"], dtype=torch.float32).eval()
    # TorchRL rejects top_k=0 in generate_kwargs; disable top-k on the model instead, so all
    # contenders sample from the same full distribution (HF would otherwise default to 50).
    model.generation_config.top_k = 0
    batch, new_tokens = options["batch"], options["new_tokens"]
    policy = TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode="history",
        generate=True,
        return_log_probs=True,
        num_samples=options["samples"],
        generate_kwargs={
            "max_new_tokens": new_tokens,
            "do_sample": True,
            "temperature": 1.0,
            "top_p": 1.0,
        },
    )
    history = History.from_chats(options["chats"])

    def run(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        td = TensorDict(history=ChatHistory(prompt=history), batch_size=(batch,))
        out = policy(td)
        responses = out.reshape(-1)["tokens"].get("response", as_list=True)
        return {"tokens": sum(int(r.numel()) for r in responses)}

    info = {"torchrl": torchrl.__version__, "torch_threads": torch.get_num_threads()}
    return info, run


if __name__ == "__main__":
    serve(setup)
