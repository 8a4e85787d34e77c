"""LoRA adapters pushed alone into a vLLM engine: :class:`VLLMAdapterSlot`.

A :class:`~llmrl.policies.vllm_engine.VLLMEngine` built with ``enable_lora=True`` loads its base
model once; each push then carries only the adapter's tensors (peft's names, as
``peft.get_peft_model_state_dict`` gives them). vLLM 0.32 loads an adapter only from a folder
(``LoRARequest.lora_path`` is required; its worker reads ``adapter_config.json`` and
``adapter_model.safetensors`` through ``PEFTHelper.from_local_dir`` and
``LoRAModel.from_local_checkpoint``); its in-memory ``LoRAModel.from_lora_tensors`` lives in the
worker process and no client call reaches it. So each push is written as a peft folder in
``/dev/shm`` (memory, not disk), loaded under a new adapter id, and the previous adapter is
unloaded and its folder deleted.

Why a new id per push: vLLM caches adapters by ``lora_int_id``; a request that reuses an id
already loaded is served the weights cached under it, whatever its folder now holds.

Build the engine with :func:`lora_engine_options` (``enable_lora``, ``max_lora_rank`` and
``lora_target_modules``). The targets matter: without them vLLM 0.32 wraps every module it
supports, the ``lm_head`` included, and its LoRA logits processor then fails on prompt
log-probs (``einsum(): subscript b has size 2 ... 11`` in ``bgmv_shrink``: it indexes adapters
per sampled row, not per prompt position), adapter or not.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

SHARED_MEMORY = Path("/dev/shm")
"""Where adapter folders are written when it exists (a RAM disk on Linux)."""

PEFT_DEFAULTS: dict[str, Any] = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "bias": "none",
    "lora_dropout": 0.0,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
}
"""``adapter_config.json`` entries a plain peft LoRA has, under the pushed ``lora_config``."""

PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""vLLM's fused modules of a Llama, and the peft targets each covers."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``)."""


def lora_engine_options(r: int, target_modules: list[str]) -> dict[str, Any]:
    """``VLLMEngine`` keyword arguments for serving adapters of rank ``r`` on ``target_modules``
    (peft's names: vLLM maps ``q_proj``/``k_proj``/``v_proj`` onto its fused ``qkv_proj``).

    Example:
        >>> lora_engine_options(12, ["q_proj", "v_proj"])
        {'enable_lora': True, 'max_lora_rank': 16, 'lora_target_modules': ['q_proj', 'v_proj']}
    """
    fits = [rank for rank in VLLM_LORA_RANKS if rank >= r]
    if not fits:
        raise ValueError(
            f"LoRA rank {r} exceeds vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}"
        )
    return {
        "enable_lora": True,
        "max_lora_rank": fits[0],
        "lora_target_modules": list(target_modules),
    }


def write_peft_adapter(
    folder: Path, named_tensors: Mapping[str, torch.Tensor], lora_config: Mapping[str, Any]
) -> Path:
    """Write ``named_tensors`` (peft's names) and ``lora_config`` (``r``, ``lora_alpha``,
    ``target_modules``, ...) as a peft adapter folder, the layout ``PeftModel.from_pretrained``
    and vLLM read; returns ``folder``."""
    from safetensors.torch import save_file

    missing = {"r", "lora_alpha", "target_modules"} - set(lora_config)
    if missing:
        raise ValueError(f"lora_config lacks {sorted(missing)} (got {sorted(lora_config)})")
    folder.mkdir(parents=True)
    config = {**PEFT_DEFAULTS, **lora_config, "target_modules": list(lora_config["target_modules"])}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in named_tensors.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


class VLLMAdapterSlot:
    """The LoRA adapter one ``vllm.LLM`` serves: the current request, the id counter and the
    folders on shared memory.

    Args:
        llm: the engine, built with ``enable_lora=True`` (vLLM's LoRA config).
        label: names the engine in errors.

    Example:
        slot = VLLMAdapterSlot(llm=engine.llm, label="smollm2")
        slot.load(peft_state, {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}, 3)
        engine.llm.generate(prompts, params, lora_request=slot.request)
    """

    def __init__(self, *, llm: Any, label: str) -> None:
        self.llm = llm
        self.label = label
        self.request: Any = None
        """The ``LoRARequest`` every generation passes (None: the base model is served)."""
        self._next_id = 1
        self._root: Path | None = None

    def _engine_config(self) -> Any:
        """vLLM's ``LoRAConfig`` of the engine (None: built without ``enable_lora``)."""
        return getattr(self.llm.llm_engine.vllm_config, "lora_config", None)

    def check(self, lora_config: Mapping[str, Any]) -> None:
        """Refuse an adapter the engine cannot serve exactly: no LoRA in the engine, a rank
        above its ``max_lora_rank``, or a target module its ``lora_target_modules`` leave out
        (vLLM would load the adapter and silently skip that module)."""
        config = self._engine_config()
        if config is None:
            raise RuntimeError(
                f"vLLM engine {self.label!r} was built without LoRA: build it with "
                "lora_engine_options(r, target_modules) (enable_lora=True, ...)"
            )
        if int(lora_config.get("r", 0)) > int(config.max_lora_rank):
            raise ValueError(
                f"adapter rank {lora_config.get('r')} exceeds vLLM engine {self.label!r}'s "
                f"max_lora_rank {config.max_lora_rank}"
            )
        if config.target_modules is not None:
            served = set(config.target_modules)
            served |= {part for name in served for part in PACKED_MODULES.get(name, ())}
            left_out = sorted(set(lora_config.get("target_modules", ())) - served)
            if left_out:
                raise ValueError(
                    f"vLLM engine {self.label!r} applies LoRA to {sorted(config.target_modules)} "
                    f"only; the adapter also targets {left_out}"
                )

    def load(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        lora_config: Mapping[str, Any],
        version: int,
    ) -> Any:
        """Load an adapter under a new id, then unload the previous one; the new request.

        Nothing changes when it fails (the previous adapter stays served).

        Raises:
            RuntimeError: the engine was built without LoRA, or vLLM refused the adapter.
            ValueError: an adapter the engine would not serve exactly (:meth:`check`).
        """
        from vllm.lora.request import LoRARequest

        self.check(lora_config)
        adapter_id = self._next_id
        folder = self._folder() / f"v{int(version)}-id{adapter_id}"
        try:
            write_peft_adapter(folder, named_tensors, lora_config)
            request = LoRARequest(
                lora_name=f"llmrl-v{int(version)}-id{adapter_id}",
                lora_int_id=adapter_id,
                lora_path=str(folder),
            )
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM engine {self.label!r} did not load adapter {folder}")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._next_id += 1
        previous, self.request = self.request, request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        return request

    def loaded(self) -> list[int]:
        """The adapter ids vLLM holds now."""
        return sorted(int(i) for i in self.llm.llm_engine.list_loras())

    def close(self) -> None:
        """Delete the adapter folders (call it when the engine stops; done at exit anyway)."""
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _folder(self) -> Path:
        if self._root is None:
            parent = SHARED_MEMORY if SHARED_MEMORY.is_dir() else None
            self._root = Path(tempfile.mkdtemp(prefix="llmrl-lora-", dir=parent))
            # shared memory outlives the process: delete the folders at exit, closed or not
            weakref.finalize(self, shutil.rmtree, self._root, True)
        return self._root
