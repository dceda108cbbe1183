"""A model folder that is not there ends the stage at once with one line: the folder and the stage that
writes it. transformers never sees the path (it would take "models/base" for a Hub repo id, retry the Hub
for ~50 s and end in an OSError traceback)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from coa.io import MissingModelError, model_folder
from tests.stages.test_distill_stage import ROOT, argv, write_inputs, write_params


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow store for the module, created here: a new SQLite store takes 5-10 s of schema migrations
    on 2 busy cores, which is MLflow's time, not the stage's that the tests time."""
    import mlflow

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    mlflow.MlflowClient(tracking_uri=uri).search_experiments()
    return uri


@pytest.fixture
def stage_dir(tmp_path, monkeypatch, mlflow_uri) -> Path:
    import transformers

    def never(*args, **kwargs):
        raise AssertionError(f"transformers asked to load {args[1:2]}: the missing folder reached it")

    write_inputs(tmp_path)  # tasks, difficulty stats, the index, a tokenizer in models/base
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    for auto in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(auto, "from_pretrained", classmethod(never))
    return tmp_path


def one_line_exit(main, args: list[str]) -> tuple[str, float]:
    start = time.perf_counter()
    with pytest.raises(SystemExit) as info:
        main(args)
    message = info.value.code
    assert isinstance(message, str) and "\n" not in message  # exit status 1, one line, no traceback
    return message, time.perf_counter() - start


def test_distill_without_the_base_folder_names_it_and_its_stage(stage_dir):
    from stages import distill

    write_params(stage_dir, "http://127.0.0.1:9/v1", max_retries=0)
    for f in (stage_dir / "models/base").iterdir():
        f.unlink()
    (stage_dir / "models/base").rmdir()
    message, took = one_line_exit(distill.main, argv(stage_dir))
    assert message == (f"distill: {stage_dir / 'models/base'}: no such model folder; "
                       "run `dvc repro base` (the base stage writes it)")
    assert took < 5, took


def test_difficulty_without_its_reference_model_names_it_and_its_stage(stage_dir):
    from stages import difficulty

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["difficulty"].update(model_path="models/reference", engine={**params["difficulty"]["engine"], "kind": "hf"})
    (stage_dir / "params.yaml").write_text(yaml.safe_dump(params))
    paths = {"tasks": "data/tasks.parquet", "stats": "data/difficulty.parquet",
             "rejects": "data/rejects/difficulty.parquet", "metrics": "metrics/difficulty.json"}
    message, took = one_line_exit(difficulty.main, ["--params", str(stage_dir / "params.yaml"),
                                                    *[x for k, v in paths.items() for x in (f"--{k}", v)]])
    assert message == ("difficulty: models/reference: no such model folder; "
                       "run `dvc repro base` (the base stage writes it)")
    assert took < 5, took
    assert not (stage_dir / "metrics/difficulty.json").exists()


def _difficulty(stage_dir: Path, **difficulty) -> list[str]:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["base"]["reference"] = "none"  # the README's recipe: the base stage leaves models/reference a note
    params["difficulty"].update(model_path="models/reference", engine={**params["difficulty"]["engine"], "kind": "hf"},
                                **difficulty)
    (stage_dir / "params.yaml").write_text(yaml.safe_dump(params))
    (stage_dir / "models/reference").mkdir(parents=True)
    (stage_dir / "models/reference/README.md").write_text("No reference model: params base.reference is none.\n")
    paths = {"tasks": "data/tasks.parquet", "stats": "data/difficulty.parquet",
             "rejects": "data/rejects/difficulty.parquet", "metrics": "metrics/difficulty.json"}
    return ["--params", str(stage_dir / "params.yaml"), *[x for k, v in paths.items() for x in (f"--{k}", v)]]


def test_difficulty_with_base_reference_none_says_what_to_set(stage_dir):
    from stages import difficulty

    message, took = one_line_exit(difficulty.main, _difficulty(stage_dir))
    assert message == ("difficulty: base.reference is none, so models/reference holds no model: point "
                       "difficulty.model_path at a model folder, or set difficulty.domains: [] (no filter)")
    assert took < 5, took


def test_difficulty_without_domains_needs_no_reference(stage_dir):
    from stages import difficulty

    difficulty.main(_difficulty(stage_dir, domains=[]))  # transformers is never asked (the fixture fails it)
    metrics = json.loads((stage_dir / "metrics/difficulty.json").read_text())
    assert metrics["covered"] == metrics["dropped"] == 0 and metrics["kept"] == metrics["tasks"] > 0


def test_an_input_model_folder_no_stage_writes_says_to_fix_the_path(stage_dir):
    from stages import base

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["base"].update(kind="hf", model_dir="inputs/models", hf_path="Qwen2.5-3B-Instruct", reference="none")
    (stage_dir / "params.yaml").write_text(yaml.safe_dump(params))
    paths = {"tasks": "data/tasks.parquet", "corpus": "data/corpus.parquet", "out": "models/base",
             "reference": "models/reference", "metrics": "metrics/base.json"}
    message, took = one_line_exit(base.main, ["--params", str(stage_dir / "params.yaml"),
                                              *[x for k, v in paths.items() for x in (f"--{k}", v)]])
    assert message.startswith("base: inputs/models/Qwen2.5-3B-Instruct: no such model folder; no stage of "
                              "dvc.yaml writes it")
    assert took < 5, took


def test_model_folder_checks_what_a_folder_holds(tmp_path):
    with pytest.raises(MissingModelError, match=r"^org/name: no such model folder; run the stage") as info:
        model_folder("org/name")  # a Hub repo id in form: still a local path here, and missing
    assert (info.value.path, info.value.reason) == ("org/name", "no such model folder")
    (tmp_path / "tok").mkdir()
    with pytest.raises(MissingModelError, match=r"not a Hugging Face model folder \(no config.json\)"):
        model_folder(tmp_path / "tok")
    with pytest.raises(MissingModelError, match=r"no tokenizer.json or tokenizer_config.json"):
        model_folder(tmp_path / "tok", tokenizer_only=True)
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    assert model_folder(tmp_path / "tok", tokenizer_only=True) == tmp_path / "tok"


def test_load_pretrained_of_a_missing_folder_never_reaches_transformers(stage_dir):
    from coa.model import load_pretrained, load_tokenizer

    for load in (load_pretrained, load_tokenizer):
        with pytest.raises(MissingModelError, match="^models/sft: no such model folder"):
            load("models/sft")
