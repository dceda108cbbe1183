"""Typed, validated configuration: one frozen dataclass per `params.yaml` section, in one place.

    from coa.config import load_params
    params = load_params("params.yaml")          # -> Params, every section checked

The modules: sections.py (`Params`, `load_params`, `common` and the sections of curate, index, difficulty,
solve_filter and eval), tools.py (`common.tools`), teacher.py (distill's), train.py (sft's and rl's, DeepSpeed),
engine.py (every `engine:`), endpoint.py (the OpenAI-compatible endpoint they share), base.py (the base stage's:
tokenizer, tiny model shape, the starting point) and kit.py (the machinery: `ConfigError`, `build`, `to_dict`,
`flatten`, `load_yaml`, `derive_seed`). Their public names are re-exported here.
"""

from coa.config.base import BaseConfig, TinyModelConfig, TokenizerConfig
from coa.config.kit import ConfigError, build, derive_seed, flatten, load_yaml, to_dict
from coa.config.sections import (
    ADAPTER_KINDS,
    WORLD_KINDS,
    AgentLimitsConfig,
    ChatEndpointConfig,
    CommonConfig,
    CrawlConfig,
    CurateConfig,
    DeepSpeedConfig,
    DifficultyConfig,
    DistillConfig,
    DistillFiltersConfig,
    DomainSamplingConfig,
    EndpointConfig,
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
    SummariserConfig,
    TeacherConfig,
    TeamLimitsConfig,
    ToolsConfig,
    VllmConfig,
    load_params,
)

__all__ = ["ADAPTER_KINDS", "WORLD_KINDS", "AgentLimitsConfig", "BaseConfig", "ChatEndpointConfig", "CommonConfig",
           "ConfigError", "CrawlConfig", "CurateConfig", "DeepSpeedConfig", "DifficultyConfig", "DistillConfig",
           "DistillFiltersConfig", "DomainSamplingConfig", "EndpointConfig", "EngineConfig", "EvalConfig", "GuideConfig",
           "IndexConfig", "JudgeConfig", "OfflineStyleConfig", "Params", "RlConfig", "SftConfig", "SolveFilterConfig",
           "SourceConfig", "SummariserConfig", "TeacherConfig", "TeamLimitsConfig",
           "TinyModelConfig", "TokenizerConfig", "ToolsConfig", "VllmConfig", "build", "derive_seed", "flatten", "load_params",
           "load_yaml", "to_dict"]
