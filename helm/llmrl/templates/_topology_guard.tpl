{{/*
Generated from llmrl/topology/rules.py by make chart-schema (scripts/chart_schema.py); do not edit.
The topology's cross-field rules (llmrl.topology.rules.RULES): a topology the values
schema cannot judge (or one installed with --skip-schema-validation) fails with the
message llmrl.topology.Topology gives, prefixed with 'topology.'.
*/}}

{{/* GPUs of one inference engine: gpus_per_engine, or derived from the backend (inference.engine_gpus). */}}
{{- define "llmrl.engineGpus" -}}
{{- (ternary (int .Values.topology.inference.gpus_per_engine) (ternary (int .Values.topology.inference.tensor_parallel_size) 0 (eq .Values.topology.inference.backend "vllm")) (not (kindIs "invalid" .Values.topology.inference.gpus_per_engine))) }}
{{- end }}

{{/* Trainer processes (torch.distributed ranks): ranks, else gpus, else 1 (trainer.world_size). */}}
{{- define "llmrl.trainerWorldSize" -}}
{{- (ternary (int .Values.topology.trainer.ranks) (ternary (int .Values.topology.trainer.gpus) 1 (gt (int .Values.topology.trainer.gpus) 0)) (not (kindIs "invalid" .Values.topology.trainer.ranks))) }}
{{- end }}

{{/* GPUs of one teacher engine: gpus_per_engine, or derived from the backend (teacher.engine_gpus). */}}
{{- define "llmrl.teacherEngineGpus" -}}
{{- (ternary (int .Values.topology.teacher.gpus_per_engine) (ternary (int (ternary 1 .Values.topology.teacher.tensor_parallel_size (kindIs "invalid" .Values.topology.teacher.tensor_parallel_size))) 0 (eq (ternary "vllm" .Values.topology.teacher.backend (kindIs "invalid" .Values.topology.teacher.backend)) "vllm")) (not (kindIs "invalid" .Values.topology.teacher.gpus_per_engine))) }}
{{- end }}

{{/* GPUs of one judge engine: gpus_per_engine, or derived from the backend (judge.engine_gpus). */}}
{{- define "llmrl.judgeEngineGpus" -}}
{{- (ternary (int .Values.topology.judge.gpus_per_engine) (ternary (int (ternary 1 .Values.topology.judge.tensor_parallel_size (kindIs "invalid" .Values.topology.judge.tensor_parallel_size))) 0 (eq (ternary "vllm" .Values.topology.judge.backend (kindIs "invalid" .Values.topology.judge.backend)) "vllm")) (not (kindIs "invalid" .Values.topology.judge.gpus_per_engine))) }}
{{- end }}

{{/* GPUs of one reward_model engine: gpus_per_engine, or derived from the backend (reward_model.engine_gpus). */}}
{{- define "llmrl.rewardModelEngineGpus" -}}
{{- (ternary (int .Values.topology.reward_model.gpus_per_engine) (ternary (int (ternary 1 .Values.topology.reward_model.tensor_parallel_size (kindIs "invalid" .Values.topology.reward_model.tensor_parallel_size))) 0 (eq (ternary "vllm" .Values.topology.reward_model.backend (kindIs "invalid" .Values.topology.reward_model.backend)) "vllm")) (not (kindIs "invalid" .Values.topology.reward_model.gpus_per_engine))) }}
{{- end }}

{{- define "llmrl.validateTopology" -}}
{{- $t := .Values.topology }}
{{- if (and (eq $t.inference.backend "transformers") (not (eq (int $t.inference.tensor_parallel_size) 1))) }}
{{- fail (printf "topology.inference.tensor_parallel_size: the transformers backend runs each engine as one process and cannot shard it; must be 1 (got %d)" (int $t.inference.tensor_parallel_size)) }}
{{- end }}
{{- if (and (eq $t.inference.backend "transformers") (not (or (and (not (kindIs "invalid" $t.inference.gpus_per_engine)) (eq (int $t.inference.gpus_per_engine) 0)) (and (not (kindIs "invalid" $t.inference.gpus_per_engine)) (eq (int $t.inference.gpus_per_engine) 1)) (kindIs "invalid" $t.inference.gpus_per_engine)))) }}
{{- fail (printf "topology.inference.gpus_per_engine: the transformers backend runs each engine on CPU or one GPU; must be 0 or 1 (got %d); use backend 'vllm' to shard an engine over several GPUs" (int (include "llmrl.engineGpus" $))) }}
{{- end }}
{{- if (and (eq $t.inference.backend "vllm") (not (or (eq (int (include "llmrl.engineGpus" $)) (int $t.inference.tensor_parallel_size)) (and (eq (int (include "llmrl.engineGpus" $)) 0) (eq (int $t.inference.tensor_parallel_size) 1))))) }}
{{- fail (printf "topology.inference.gpus_per_engine: a vllm engine uses one GPU per tensor-parallel rank; must equal inference.tensor_parallel_size (%d), or be 0 with tensor_parallel_size 1 for vLLM's CPU build; got %d" (int $t.inference.tensor_parallel_size) (int (include "llmrl.engineGpus" $))) }}
{{- end }}
{{- if (and (gt (int $t.trainer.gpus) 0) (not (kindIs "invalid" $t.trainer.ranks)) (not (and (not (kindIs "invalid" $t.trainer.ranks)) (eq (int $t.trainer.ranks) (int $t.trainer.gpus))))) }}
{{- fail (printf "topology.trainer.ranks: each rank of a GPU trainer drives one GPU; must equal trainer.gpus (%d) or be left out (got %d); set trainer.gpus to 0 for CPU ranks" (int $t.trainer.gpus) (int $t.trainer.ranks)) }}
{{- end }}
{{- if (and (eq $t.trainer.strategy "single") (not (le (int $t.trainer.gpus) 1))) }}
{{- fail (printf "topology.trainer.gpus: strategy 'single' trains in one process on at most 1 GPU (got %d); use strategy 'ddp' or 'fsdp' for more" (int $t.trainer.gpus)) }}
{{- end }}
{{- if (and (eq $t.trainer.strategy "single") (not (or (and (not (kindIs "invalid" $t.trainer.ranks)) (eq (int $t.trainer.ranks) 1)) (kindIs "invalid" $t.trainer.ranks)))) }}
{{- fail (printf "topology.trainer.ranks: strategy 'single' trains in one process; must be 1 or left out (got %d); use strategy 'ddp' or 'fsdp' for several ranks" (int $t.trainer.ranks)) }}
{{- end }}
{{- if (and (or (eq $t.trainer.strategy "ddp") (eq $t.trainer.strategy "fsdp")) (kindIs "invalid" $t.trainer.ranks) (not (ge (int $t.trainer.gpus) 2))) }}
{{- fail (printf "topology.trainer.gpus: strategy '%s' spreads training over several ranks and needs at least 2 (the trainer's world size is %d); set trainer.gpus >= 2 (one rank per GPU), or trainer.gpus 0 and trainer.ranks >= 2 to train on CPU, or use strategy 'single'" $t.trainer.strategy (int (include "llmrl.trainerWorldSize" $))) }}
{{- end }}
{{- if (and (or (eq $t.trainer.strategy "ddp") (eq $t.trainer.strategy "fsdp")) (not (kindIs "invalid" $t.trainer.ranks)) (not (and (not (kindIs "invalid" $t.trainer.ranks)) (ge (int $t.trainer.ranks) 2)))) }}
{{- fail (printf "topology.trainer.ranks: strategy '%s' spreads training over several ranks and needs at least 2 (the trainer's world size is %d); set trainer.gpus >= 2 (one rank per GPU), or trainer.gpus 0 and trainer.ranks >= 2 to train on CPU, or use strategy 'single'" $t.trainer.strategy (int (include "llmrl.trainerWorldSize" $))) }}
{{- end }}
{{- if (and (eq $t.reference.placement "dedicated") (not (ge (int $t.reference.gpus) 1))) }}
{{- fail (printf "topology.reference.gpus: a dedicated reference model runs on its own GPUs; must be > 0 (got %d), or use placement 'with_trainer'" (int $t.reference.gpus)) }}
{{- end }}
{{- if (and (ne $t.reference.placement "dedicated") (not (eq (int $t.reference.gpus) 0))) }}
{{- fail (printf "topology.reference.gpus: only a dedicated reference has GPUs of its own; must be 0 for placement '%s' (got %d)" $t.reference.placement (int $t.reference.gpus)) }}
{{- end }}
{{- if (and (eq $t.colocated true) (not (eq $t.inference.backend "vllm"))) }}
{{- fail (printf "topology.colocated: inference and training share GPUs, which needs the vllm backend (inference.backend is '%s')" $t.inference.backend) }}
{{- end }}
{{- if (and (eq $t.colocated true) (eq $t.inference.backend "vllm") (not (eq (int $t.trainer.gpus) (mul (int $t.inference.engines) (int $t.inference.tensor_parallel_size))))) }}
{{- fail (printf "topology.trainer.gpus: colocated inference and training share the same GPUs, so it must equal inference.engines * inference.tensor_parallel_size (%d x %d = %d), got %d" (int $t.inference.engines) (int $t.inference.tensor_parallel_size) (mul (int $t.inference.engines) (int $t.inference.tensor_parallel_size)) (int $t.trainer.gpus)) }}
{{- end }}
{{- if (and (eq $t.colocated true) (eq $t.inference.backend "vllm") (not (lt (float64 $t.inference.gpu_memory_utilization) 1.0))) }}
{{- fail "topology.inference.gpu_memory_utilization: colocated engines share their GPUs with the trainer; must be < 1 to leave it memory (e.g. 0.4)" }}
{{- end }}
{{- if (and (eq $t.weight_transport "vllm") (not (eq $t.inference.backend "vllm"))) }}
{{- fail (printf "topology.weight_transport: 'vllm' pushes straight into vllm engines; inference.backend is '%s' (use 'object_store', 'broadcast' or 'auto')" $t.inference.backend) }}
{{- end }}
{{- if (and (eq $t.weight_transport "broadcast") (not (eq $t.inference.backend "transformers"))) }}
{{- fail "topology.weight_transport: 'broadcast' sends to transformers engines; for inference.backend 'vllm' use 'vllm' (or 'object_store', 'auto')" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (kindIs "invalid" $t.teacher.url) (not (not (kindIs "invalid" $t.teacher.model)))) }}
{{- fail "topology.teacher.model: required unless url is set: the model the role runs on engines of its own (a model name, folder or GGUF file), or give url, the base URL of a served endpoint" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (not (kindIs "invalid" $t.teacher.url)) (not (kindIs "invalid" $t.teacher.model))) }}
{{- fail "topology.teacher.model: set exactly one of model and url: with url the role calls that endpoint and runs no model of its own (name the served model with served_model)" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (kindIs "invalid" $t.teacher.url) (not (kindIs "invalid" $t.teacher.served_model))) }}
{{- fail "topology.teacher.served_model: names the model of a served endpoint; set url too, or leave it out when the role runs model on engines of its own" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (not (kindIs "invalid" $t.teacher.url)) (not (eq (int (ternary 1 $t.teacher.engines (kindIs "invalid" $t.teacher.engines))) 1))) }}
{{- fail (printf "topology.teacher.engines: a served endpoint (url) places no engines; must be 1 (got %d): scale the server behind the url instead" (int (ternary 1 $t.teacher.engines (kindIs "invalid" $t.teacher.engines)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (not (kindIs "invalid" $t.teacher.url)) (not (eq (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.teacher.tensor_parallel_size: a served endpoint (url) places no engines; must be 1 (got %d): the server shards its model itself" (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (not (kindIs "invalid" $t.teacher.url)) (not (or (and (not (kindIs "invalid" $t.teacher.gpus_per_engine)) (eq (int $t.teacher.gpus_per_engine) 0)) (kindIs "invalid" $t.teacher.gpus_per_engine)))) }}
{{- fail (printf "topology.teacher.gpus_per_engine: a served endpoint (url) places no engines, so it gets no GPUs; must be 0 or left out (got %d)" (int $t.teacher.gpus_per_engine)) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (kindIs "invalid" $t.teacher.url) (eq (ternary "vllm" $t.teacher.backend (kindIs "invalid" $t.teacher.backend)) "transformers") (not (eq (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.teacher.tensor_parallel_size: the transformers backend runs each engine as one process and cannot shard it; must be 1 (got %d)" (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (kindIs "invalid" $t.teacher.url) (eq (ternary "vllm" $t.teacher.backend (kindIs "invalid" $t.teacher.backend)) "transformers") (not (or (and (not (kindIs "invalid" $t.teacher.gpus_per_engine)) (eq (int $t.teacher.gpus_per_engine) 0)) (and (not (kindIs "invalid" $t.teacher.gpus_per_engine)) (eq (int $t.teacher.gpus_per_engine) 1)) (kindIs "invalid" $t.teacher.gpus_per_engine)))) }}
{{- fail (printf "topology.teacher.gpus_per_engine: the transformers backend runs each engine on CPU or one GPU; must be 0 or 1 (got %d); use backend 'vllm' to shard an engine over several GPUs" (int (include "llmrl.teacherEngineGpus" $))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.teacher)) (kindIs "invalid" $t.teacher.url) (eq (ternary "vllm" $t.teacher.backend (kindIs "invalid" $t.teacher.backend)) "vllm") (not (or (eq (int (include "llmrl.teacherEngineGpus" $)) (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size)))) (and (eq (int (include "llmrl.teacherEngineGpus" $)) 0) (eq (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size))) 1))))) }}
{{- fail (printf "topology.teacher.gpus_per_engine: a vllm engine uses one GPU per tensor-parallel rank; must equal teacher.tensor_parallel_size (%d), or be 0 with tensor_parallel_size 1 for vLLM's CPU build; got %d" (int (ternary 1 $t.teacher.tensor_parallel_size (kindIs "invalid" $t.teacher.tensor_parallel_size))) (int (include "llmrl.teacherEngineGpus" $))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (kindIs "invalid" $t.judge.url) (not (not (kindIs "invalid" $t.judge.model)))) }}
{{- fail "topology.judge.model: required unless url is set: the model the role runs on engines of its own (a model name, folder or GGUF file), or give url, the base URL of a served endpoint" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (not (kindIs "invalid" $t.judge.url)) (not (kindIs "invalid" $t.judge.model))) }}
{{- fail "topology.judge.model: set exactly one of model and url: with url the role calls that endpoint and runs no model of its own (name the served model with served_model)" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (kindIs "invalid" $t.judge.url) (not (kindIs "invalid" $t.judge.served_model))) }}
{{- fail "topology.judge.served_model: names the model of a served endpoint; set url too, or leave it out when the role runs model on engines of its own" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (not (kindIs "invalid" $t.judge.url)) (not (eq (int (ternary 1 $t.judge.engines (kindIs "invalid" $t.judge.engines))) 1))) }}
{{- fail (printf "topology.judge.engines: a served endpoint (url) places no engines; must be 1 (got %d): scale the server behind the url instead" (int (ternary 1 $t.judge.engines (kindIs "invalid" $t.judge.engines)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (not (kindIs "invalid" $t.judge.url)) (not (eq (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.judge.tensor_parallel_size: a served endpoint (url) places no engines; must be 1 (got %d): the server shards its model itself" (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (not (kindIs "invalid" $t.judge.url)) (not (or (and (not (kindIs "invalid" $t.judge.gpus_per_engine)) (eq (int $t.judge.gpus_per_engine) 0)) (kindIs "invalid" $t.judge.gpus_per_engine)))) }}
{{- fail (printf "topology.judge.gpus_per_engine: a served endpoint (url) places no engines, so it gets no GPUs; must be 0 or left out (got %d)" (int $t.judge.gpus_per_engine)) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (kindIs "invalid" $t.judge.url) (eq (ternary "vllm" $t.judge.backend (kindIs "invalid" $t.judge.backend)) "transformers") (not (eq (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.judge.tensor_parallel_size: the transformers backend runs each engine as one process and cannot shard it; must be 1 (got %d)" (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (kindIs "invalid" $t.judge.url) (eq (ternary "vllm" $t.judge.backend (kindIs "invalid" $t.judge.backend)) "transformers") (not (or (and (not (kindIs "invalid" $t.judge.gpus_per_engine)) (eq (int $t.judge.gpus_per_engine) 0)) (and (not (kindIs "invalid" $t.judge.gpus_per_engine)) (eq (int $t.judge.gpus_per_engine) 1)) (kindIs "invalid" $t.judge.gpus_per_engine)))) }}
{{- fail (printf "topology.judge.gpus_per_engine: the transformers backend runs each engine on CPU or one GPU; must be 0 or 1 (got %d); use backend 'vllm' to shard an engine over several GPUs" (int (include "llmrl.judgeEngineGpus" $))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.judge)) (kindIs "invalid" $t.judge.url) (eq (ternary "vllm" $t.judge.backend (kindIs "invalid" $t.judge.backend)) "vllm") (not (or (eq (int (include "llmrl.judgeEngineGpus" $)) (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size)))) (and (eq (int (include "llmrl.judgeEngineGpus" $)) 0) (eq (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size))) 1))))) }}
{{- fail (printf "topology.judge.gpus_per_engine: a vllm engine uses one GPU per tensor-parallel rank; must equal judge.tensor_parallel_size (%d), or be 0 with tensor_parallel_size 1 for vLLM's CPU build; got %d" (int (ternary 1 $t.judge.tensor_parallel_size (kindIs "invalid" $t.judge.tensor_parallel_size))) (int (include "llmrl.judgeEngineGpus" $))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (kindIs "invalid" $t.reward_model.url) (not (not (kindIs "invalid" $t.reward_model.model)))) }}
{{- fail "topology.reward_model.model: required unless url is set: the model the role runs on engines of its own (a model name, folder or GGUF file), or give url, the base URL of a served endpoint" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (not (kindIs "invalid" $t.reward_model.url)) (not (kindIs "invalid" $t.reward_model.model))) }}
{{- fail "topology.reward_model.model: set exactly one of model and url: with url the role calls that endpoint and runs no model of its own (name the served model with served_model)" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (kindIs "invalid" $t.reward_model.url) (not (kindIs "invalid" $t.reward_model.served_model))) }}
{{- fail "topology.reward_model.served_model: names the model of a served endpoint; set url too, or leave it out when the role runs model on engines of its own" }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (not (kindIs "invalid" $t.reward_model.url)) (not (eq (int (ternary 1 $t.reward_model.engines (kindIs "invalid" $t.reward_model.engines))) 1))) }}
{{- fail (printf "topology.reward_model.engines: a served endpoint (url) places no engines; must be 1 (got %d): scale the server behind the url instead" (int (ternary 1 $t.reward_model.engines (kindIs "invalid" $t.reward_model.engines)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (not (kindIs "invalid" $t.reward_model.url)) (not (eq (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.reward_model.tensor_parallel_size: a served endpoint (url) places no engines; must be 1 (got %d): the server shards its model itself" (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (not (kindIs "invalid" $t.reward_model.url)) (not (or (and (not (kindIs "invalid" $t.reward_model.gpus_per_engine)) (eq (int $t.reward_model.gpus_per_engine) 0)) (kindIs "invalid" $t.reward_model.gpus_per_engine)))) }}
{{- fail (printf "topology.reward_model.gpus_per_engine: a served endpoint (url) places no engines, so it gets no GPUs; must be 0 or left out (got %d)" (int $t.reward_model.gpus_per_engine)) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (kindIs "invalid" $t.reward_model.url) (eq (ternary "vllm" $t.reward_model.backend (kindIs "invalid" $t.reward_model.backend)) "transformers") (not (eq (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size))) 1))) }}
{{- fail (printf "topology.reward_model.tensor_parallel_size: the transformers backend runs each engine as one process and cannot shard it; must be 1 (got %d)" (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size)))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (kindIs "invalid" $t.reward_model.url) (eq (ternary "vllm" $t.reward_model.backend (kindIs "invalid" $t.reward_model.backend)) "transformers") (not (or (and (not (kindIs "invalid" $t.reward_model.gpus_per_engine)) (eq (int $t.reward_model.gpus_per_engine) 0)) (and (not (kindIs "invalid" $t.reward_model.gpus_per_engine)) (eq (int $t.reward_model.gpus_per_engine) 1)) (kindIs "invalid" $t.reward_model.gpus_per_engine)))) }}
{{- fail (printf "topology.reward_model.gpus_per_engine: the transformers backend runs each engine on CPU or one GPU; must be 0 or 1 (got %d); use backend 'vllm' to shard an engine over several GPUs" (int (include "llmrl.rewardModelEngineGpus" $))) }}
{{- end }}
{{- if (and (not (kindIs "invalid" $t.reward_model)) (kindIs "invalid" $t.reward_model.url) (eq (ternary "vllm" $t.reward_model.backend (kindIs "invalid" $t.reward_model.backend)) "vllm") (not (or (eq (int (include "llmrl.rewardModelEngineGpus" $)) (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size)))) (and (eq (int (include "llmrl.rewardModelEngineGpus" $)) 0) (eq (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size))) 1))))) }}
{{- fail (printf "topology.reward_model.gpus_per_engine: a vllm engine uses one GPU per tensor-parallel rank; must equal reward_model.tensor_parallel_size (%d), or be 0 with tensor_parallel_size 1 for vLLM's CPU build; got %d" (int (ternary 1 $t.reward_model.tensor_parallel_size (kindIs "invalid" $t.reward_model.tensor_parallel_size))) (int (include "llmrl.rewardModelEngineGpus" $))) }}
{{- end }}
{{- end }}
