"""Stage configs: the shared YAML loading machinery and each stage's settings."""

from llmrl.config.loading import ConfigError, ConfigModel, dump_config, load_config
from llmrl.config.prepare import (
    GENERATED_TASKS,
    SOURCE_TASK_FIELDS,
    GenerateConfig,
    PrepareConfig,
    SplitConfig,
)

__all__ = [
    "GENERATED_TASKS",
    "SOURCE_TASK_FIELDS",
    "ConfigError",
    "ConfigModel",
    "GenerateConfig",
    "PrepareConfig",
    "SplitConfig",
    "dump_config",
    "load_config",
]
