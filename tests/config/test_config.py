from __future__ import annotations

from pathlib import Path

import pytest

from coa.config import ConfigError, Params, derive_seed, flatten, load_params, to_dict


def test_shipped_params_load(repo_root):
    params = load_params(repo_root / "params.yaml")
    assert isinstance(params, Params)
    assert abs(sum(params.curate.splits.values()) - 1) < 1e-9
    assert params.base.tiny.hidden_size % params.base.tiny.num_attention_heads == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"curate.splitz": 1}, r"curate\.splitz: unknown key; did you mean 'splits'\?"),
        ({"common.seed": "seven"}, r"common\.seed: must be an integer"),
        ({"common.seed": -1}, r"common\.seed: must be >= 0"),
        ({"curate.splits": {"sft": 0.5, "rl": 0.2, "eval": 0.2}}, r"curate\.splits: fractions must sum to 1"),
        ({"curate.splits": {"sft": 0.5, "eval": 0.5}}, r"curate\.splits: keys must be exactly"),
        ({"curate.sources": [{"kind": "world:wbe", "n": 3}]}, r"curate\.sources\[0\]\.kind: unknown source kind 'world:wbe' \(did you mean world:web\?\)"),
        ({"curate.sources": [{"kind": "world:web"}]}, r"curate\.sources\[0\]\.n: world:web needs n"),
        ({"curate.sources": [{"kind": "world:web", "n": 3, "colour": 1}]}, r"curate\.sources\[0\]\.colour: unknown key"),
        ({"curate.sources": [{"kind": "hotpotqa"}]}, r"curate\.sources\[0\]\.path: hotpotqa needs path"),
        ({"curate.sources": [{"kind": "hotpotqa", "path": "h.json", "n": 3}]}, r"curate\.sources\[0\]\.n: hotpotqa is read from a file"),
        ({"curate.sources": [{"kind": "hotpotq", "path": "h.json"}]}, r"did you mean hotpotqa\?"),
        ({"curate.decontaminate_ngram": -1}, r"curate\.decontaminate_ngram: must be >= 0"),
        ({"curate.corpus": [{"path": "wiki.txt"}]}, r"curate\.corpus\[0\]\.path: a corpus file is \.jsonl"),
        ({"curate.corpus": [{"file": "wiki.jsonl"}]}, r"curate\.corpus\[0\]\.file: unknown key"),
        ({"common.tools.search_provider": "google"}, r"common\.tools\.search_provider: must be one of \['bm25', 'http'\]"),
        ({"common.tools.sandbox": "loose"}, r"common\.tools\.sandbox: must be one of \['strict', 'permissive'\]"),
        ({"index.b": 2.0}, r"index\.b: must be within \[0, 1\]"),
        ({"base.kind": "huge"}, r"base\.kind: must be one of \['tiny', 'hf', 'smollm2'\], got 'huge'"),
        ({"base.kind": "hf"}, r"base\.hf_path: kind=hf needs hf_path"),
        ({"base.tiny.num_attention_heads": 3}, r"base\.tiny\.num_attention_heads: must divide hidden_size"),
        ({"base.tokenizer.vocab_size": 1.5}, r"base\.tokenizer\.vocab_size: must be an integer"),
        # a validator names only its field; the loader says where the section sits (engines are in many stages)
        ({"sft.logprob_chunk": -1}, r"^sft\.logprob_chunk: must be >= 0 \(positions per chunk; 0 = off\)"),
        ({"rl.engine.max_batch": 0}, r"^rl\.engine\.max_batch: must be >= 1"),
        ({"eval.engine.max_batch": 0}, r"^eval\.engine\.max_batch: must be >= 1"),
        ({"eval.engine.max_batch_float32": 0}, r"^eval\.engine\.max_batch_float32: must be >= 1 or null"),
        ({"eval.sampling.web.top_p": 2.0}, r"^eval\.sampling\.web\.top_p: must be within"),
    ],
)
def test_bad_values_name_the_key(repo_root, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_params(repo_root / "params.yaml", overrides)


def test_sandbox_is_permissive_on_a_laptop_and_strict_in_the_paper_preset(repo_root):
    import yaml

    assert load_params(repo_root / "params.yaml").common.tools.sandbox == "permissive"
    preset = yaml.safe_load((repo_root / "configs/paper.yaml").read_text())
    flat = {k: v for k, v in flatten(preset).items() if k.startswith("common.tools.")}
    assert load_params(repo_root / "params.yaml", flat).common.tools.sandbox == "strict"


def test_missing_key_says_what_to_add(repo_root, tmp_path):
    text = (repo_root / "params.yaml").read_text().replace("  min_code_tests: 5\n", "")
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"curate\.min_code_tests: missing; add it \(Code tasks"):
        load_params(tmp_path / "params.yaml")


def test_missing_file():
    with pytest.raises(ConfigError, match="no such params file"):
        load_params("/nonexistent/params.yaml")


def test_configs_are_frozen(repo_root):
    params = load_params(repo_root / "params.yaml")
    with pytest.raises(AttributeError):
        params.common.seed = 3  # type: ignore[misc]


def test_derive_seed_is_stable_and_distinct():
    assert derive_seed(1, "a") == derive_seed(1, "a")
    assert derive_seed(1, "a") != derive_seed(1, "b")
    assert derive_seed(1, "a") != derive_seed(2, "a")
    assert 0 <= derive_seed(123, "x", "y") < 2**31


def test_to_dict_round_trips_through_build(repo_root):
    from coa.config import build

    params = load_params(repo_root / "params.yaml")
    assert build(Params, to_dict(params), "") == params
    assert flatten({"a": {"b": [1, {"c": 2}]}}) == {"a.b.0": 1, "a.b.1.c": 2}


def test_the_openai_compatible_endpoint_is_declared_once():
    """An endpoint's base_url and api_key_env (and a chat endpoint's model, timeout, retries and concurrency) are
    declared in coa/config/endpoint.py alone: the summariser, the judge, an LLM teacher and an engine inherit
    them, under the keys params.yaml has always had."""
    import ast

    from coa.config import (
        ChatEndpointConfig,
        EndpointConfig,
        EngineConfig,
        JudgeConfig,
        SummariserConfig,
        TeacherConfig,
    )

    shared = {"base_url", "api_key_env", "model", "timeout_s", "max_retries", "max_concurrency"}
    config = Path(__file__).resolve().parents[2] / "coa" / "config"
    declared = sorted((path.name, node.target.id) for path in config.glob("*.py")
                      for cls in ast.parse(path.read_text()).body if isinstance(cls, ast.ClassDef)
                      and cls.name.endswith(("SummariserConfig", "JudgeConfig", "TeacherConfig", "EngineConfig",
                                             "EndpointConfig"))
                      for node in cls.body if isinstance(node, ast.AnnAssign) and node.target.id in shared)
    assert declared == sorted(("endpoint.py", name) for name in shared)
    assert all(issubclass(c, ChatEndpointConfig) for c in (SummariserConfig, JudgeConfig, TeacherConfig))
    assert issubclass(EngineConfig, EndpointConfig) and not issubclass(EngineConfig, ChatEndpointConfig)
