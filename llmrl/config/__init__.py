"""Stage configs: the shared YAML loading machinery and each stage's settings.

Layer 1 (data, models, topology, tracking): imports core and topology.
"""

from llmrl.config.prepare import (
    GENERATED_TASKS,
    SOURCE_TASK_FIELDS,
    GenerateConfig,
    PrepareConfig,
    SplitConfig,
)
from llmrl.core.config_loading import ConfigError, ConfigModel, dump_config, load_config

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
