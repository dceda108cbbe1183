"""dtype auto: bf16 only where the hardware computes it natively."""
import pytest
import torch

from coa import device
from coa.device import native_bf16, resolve_dtype


def _cpu(monkeypatch, *, avx512_bf16=False, amx=False, flags="", capability=None, speedup=0.6):
    """A CPU with these bf16 units; ``speedup``: what its bf16 training probe measures (0.6: the Xeon's)."""
    monkeypatch.setattr(device, "bf16_training_speedup", lambda: speedup)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(device, "_cpu_flags", lambda: set(flags.split()))
    native = avx512_bf16 or amx or "bf16" in flags  # a bf16 unit comes with AVX-512: torch's kernels at AVX512
    monkeypatch.setattr(device, "cpu_capability", lambda: capability or ("AVX512" if native else "AVX2"))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


def test_avx2_cpu_gets_float32(monkeypatch):
    _cpu(monkeypatch, flags="sse4_2 avx avx2 fma")
    assert not native_bf16("cpu")
    assert resolve_dtype("auto", "cpu") == torch.float32


@pytest.mark.parametrize("kw", [{"avx512_bf16": True}, {"amx": True}, {"flags": "avx2 avx512f avx512_bf16"},
                                {"flags": "amx_tile amx_bf16"}])
def test_native_bf16_cpu_gets_bfloat16(monkeypatch, kw):
    _cpu(monkeypatch, **kw)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16


@pytest.mark.parametrize("held", [{"capability": "AVX2"}, {"env": ("ONEDNN_MAX_CPU_ISA", "AVX2")},
                                  {"env": ("DNNL_MAX_CPU_ISA", "avx512_core")}])
def test_an_avx512_bf16_cpu_held_to_avx2_gets_float32(monkeypatch, held):
    """ATEN_CPU_CAPABILITY=avx2 (torch reports AVX2) or oneDNN held below its bf16 ISA: bf16 would be emulated,
    so auto is float32, as on a real AVX2 laptop (docs/sizing.md: the AVX2 run)."""
    _cpu(monkeypatch, avx512_bf16=True, amx=True, capability=held.get("capability"))
    if "env" in held:
        monkeypatch.setenv(*held["env"])
    assert resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert resolve_dtype("auto", "cpu") == (torch.float32 if "capability" in held else torch.bfloat16)


def test_cuda_follows_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda", train=True) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda", train=True) == torch.float32


def test_explicit_names_and_errors():
    assert resolve_dtype("bfloat16") == torch.bfloat16
    assert resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="auto"):
        resolve_dtype("fp8")


def test_cpu_flags_reads_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert device._cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert device._cpu_flags(tmp_path / "missing") == set()


def test_shipped_params_use_auto():
    from pathlib import Path

    import yaml

    def values(node):  # every (key, value) leaf of the params tree
        if isinstance(node, dict):
            for key, value in node.items():
                yield from ((key, value),) if not isinstance(value, (dict, list)) else values(value)
        elif isinstance(node, list):
            for item in node:
                yield from values(item)

    text = (Path(__file__).resolve().parents[1] / "params.yaml").read_text()
    leaves = list(values(yaml.safe_load(text)))
    assert "bfloat16" not in text and not [v for _, v in leaves if v in ("float32", "bfloat16")]
    assert {v for k, v in leaves if k == "dtype"} == {"auto"}


@pytest.mark.parametrize("kw, amx, avx512_bf16", [({"flags": "avx2 fma"}, False, False),
                                                   ({"flags": "avx512f avx512_bf16"}, False, True),
                                                   ({"amx": True}, True, False),
                                                   ({"avx512_bf16": True, "flags": "amx_tile amx_bf16"}, True, True)])
def test_hardware_facts_name_the_bf16_units(monkeypatch, kw, amx, avx512_bf16):
    _cpu(monkeypatch, **kw)
    facts = device.hardware_facts()
    assert facts == {"cpu_capability": device.cpu_capability(), "amx": amx,
                     "avx512_bf16": avx512_bf16}
    assert native_bf16("cpu") == (amx or avx512_bf16)
    assert device.compute_facts(torch.bfloat16) == {"dtype": "bfloat16", **facts}
    assert device.compute_facts("float32")["dtype"] == "float32" and "dtype" not in device.compute_facts(None)


@pytest.mark.skipif(not ({"avx2", "fma"} <= device._cpu_flags()), reason="needs an x86 CPU with AVX2")
def test_make_isa_avx2_holds_every_library_to_avx2(repo_root):
    """`make ... ISA=avx2` (the AVX2 laptop's run on any x86 CPU): PyTorch's kernels report AVX2, dtype auto
    resolves float32, and MKL, oneDNN and the C kernels get their limits; any other ISA value stops make."""
    import subprocess
    import sys

    probe = (f"{sys.executable} -c 'import torch; from coa.device import resolve_dtype; "
             "print(torch.backends.cpu.get_cpu_capability(), resolve_dtype(\"auto\", \"cpu\"))'; "
             "echo $$MKL_ENABLE_INSTRUCTIONS $$ONEDNN_MAX_CPU_ISA $$COA_KERNEL_MARCH")
    run = subprocess.run(["make", "-s", "--no-print-directory", "--eval", f"probe: ; @{probe}", "probe", "ISA=avx2"],
                         cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["AVX2", "torch.float32", "AVX2", "AVX2", "x86-64-v3"]
    bad = subprocess.run(["make", "-s", "--eval", "probe: ; @true", "probe", "ISA=sse"], cwd=repo_root,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "the one value is avx2" in bad.stderr


@pytest.mark.parametrize("kw, train", [({"flags": "avx2 avx512f avx512_bf16"}, torch.float32),
                                       ({"avx512_bf16": True}, torch.float32),
                                       ({"amx": True}, torch.bfloat16),
                                       ({"avx512_bf16": True, "flags": "amx_tile amx_bf16"}, torch.bfloat16)])
def test_training_takes_bf16_with_amx_and_not_where_the_probe_finds_it_slower(monkeypatch, kw, train):
    """AVX512_BF16 alone decodes bf16 natively, but a Xeon trained 1.65x slower under bf16 autocast than in float32
    (its probe: 0.6x; docs/sizing.md): rollouts get bf16 there, the trainers float32; AMX gets bf16 for both."""
    _cpu(monkeypatch, **kw)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    assert resolve_dtype("auto", "cpu", train=True) == train
    assert resolve_dtype("bfloat16", "cpu", train=True) == torch.bfloat16  # a name is a name
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # oneDNN held below its AMX ISA
    assert resolve_dtype("auto", "cpu", train=True) == torch.float32
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert resolve_dtype("auto", "cpu", train=True) == train


@pytest.mark.parametrize("speedup, train", [(0.6, torch.float32), (1.2, torch.float32), (1.25, torch.bfloat16),
                                            (3.1, torch.bfloat16)])
def test_avx512_bf16_without_amx_trains_in_bf16_where_the_probe_finds_it_faster(monkeypatch, speedup, train):
    """A Zen 5 EPYC trains 1.93x faster in bf16 (bench/sft.py --dtype; its probe 3.1x): the probe decides, with a
    margin (BF16_TRAIN_MIN_SPEEDUP), and never where bf16 is emulated (held to AVX2)."""
    _cpu(monkeypatch, avx512_bf16=True, speedup=speedup)
    assert resolve_dtype("auto", "cpu", train=True) == train
    _cpu(monkeypatch, avx512_bf16=True, speedup=speedup, capability="AVX2")
    assert resolve_dtype("auto", "cpu", train=True) == torch.float32


def test_the_bf16_training_probe_measures_once_a_process():
    device.bf16_training_speedup.cache_clear()
    first = device.bf16_training_speedup()
    assert first > 0 and device.bf16_training_speedup() == first
    assert device.bf16_training_speedup.cache_info().hits >= 1
