"""Typed, validated configuration: one frozen dataclass per `params.yaml` section, in one place.

    from coa.config import load_params
    params = load_params("params.yaml")          # -> Params, every section checked

The modules: sections.py (every section of `params.yaml`, `Params`, `load_params`), base.py (the base stage's
sections: tokenizer, tiny model shape, the starting point) and kit.py (the machinery: `ConfigError`, `build`,
`to_dict`, `flatten`, `load_yaml`, `derive_seed`). Their public names are re-exported here.
"""

from coa.config.base import BaseConfig, TinyModelConfig, TokenizerConfig
from coa.config.kit import ConfigError, build, derive_seed, flatten, load_yaml, to_dict
from coa.config.sections import (
    ADAPTER_KINDS,
    WORLD_KINDS,
    AgentLimitsConfig,
    CommonConfig,
    CurateConfig,
    DeepSpeedConfig,
    DifficultyConfig,
    DistillConfig,
    DistillFiltersConfig,
    DomainSamplingConfig,
    EngineConfig,
    EvalConfig,
    GuideConfig,
    IndexConfig,
    JudgeConfig,
    OfflineStyleConfig,
    Params,
    RlConfig,
    SftConfig,
    SolveFilterConfig,
    SourceConfig,
    TeacherConfig,
    TeamLimitsConfig,
    ToolsConfig,
    VllmConfig,
    load_params,
)

__all__ = ["ADAPTER_KINDS", "WORLD_KINDS", "AgentLimitsConfig", "BaseConfig", "CommonConfig", "ConfigError",
           "CurateConfig", "DeepSpeedConfig", "DifficultyConfig", "DistillConfig", "DistillFiltersConfig",
           "DomainSamplingConfig", "EngineConfig", "EvalConfig", "GuideConfig", "IndexConfig", "JudgeConfig", "OfflineStyleConfig",
           "Params", "RlConfig", "SftConfig", "SolveFilterConfig", "SourceConfig", "TeacherConfig", "TeamLimitsConfig",
           "TinyModelConfig", "TokenizerConfig", "ToolsConfig", "VllmConfig", "build", "derive_seed", "flatten", "load_params",
           "load_yaml", "to_dict"]
