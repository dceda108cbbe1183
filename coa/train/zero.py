"""DeepSpeed ZeRO for the SFT loop (coa.train.sft) and the RL update (coa.train.dapo): config from params, sharded
loading, engine, gathered model, the weights handed to a rollout engine module by module.

    hold = zero3_loading(cfg.deepspeed, "sft", **settings)   # before from_pretrained: ZeRO-3 ranks load their shard
    optimizer = build_optimizer(model, cfg.lr, cfg.betas, cfg.weight_decay, cpu_adam=cfg.deepspeed.offload_optimizer)
    engine, scheduler = deepspeed_init(model, optimizer, cfg.deepspeed, lr_lambda, **settings)
    model = gathered_model(engine, rank)         # rank 0: the trained model in its 16-bit dtype (every rank calls)
    model = deepspeed_full_model(engine, rank)   # rank 0: the float32 master weights (SFT's; every rank calls)
    ref = deepspeed_inference(model, cfg.deepspeed, **settings)   # forwards only; ZeRO-3: stays sharded
    rollout_engine.sync(module_weights(engine.module))   # every rank calls: ZeRO-3 gathers one module at a time

``settings`` are the stage's pieces of the config (``deepspeed_config``'s keywords): coa.train.sft.zero_settings
(rows per micro-batch, micro-batches per step) and coa.train.dapo.ranks.zero_settings (one row per forward, an
optimizer step whenever the loop calls it). Runs on CPU with gloo in one process: the env vars of a
launcher are filled in when absent.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch

from coa.config import DeepSpeedConfig
from coa.device import default_device, resolve_dtype
from coa.launch import kill_point
from coa.train import collective


def require_deepspeed(section: str) -> None:
    """One line (SystemExit) when ``<section>.deepspeed.enabled`` is set but DeepSpeed is not installed."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        raise SystemExit(f"{section}.deepspeed.enabled is true but DeepSpeed is not installed: pip install -e .[train] "
                         f"(or set {section}.deepspeed.enabled: false)") from None


def _dist_env() -> None:
    """Single-process defaults for torch.distributed when no launcher set them."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def init_distributed(ds: DeepSpeedConfig) -> None:
    """The default process group (DeepSpeed's communication layer over torch.distributed, ``ds.dist_backend``)
    with ``ds.timeout_minutes`` for every collective, the gloo side groups of coa.train.collective included;
    a launcher's variables filled in for one process when absent. Idempotent: a second call changes nothing."""
    _dist_env()
    import deepspeed

    if ds.dist_backend == "gloo":
        # DeepSpeed's CPU communication layer JIT-builds its shared-memory op at init (a C++ build, minutes the
        # first time, under a lock file a killed build leaves behind); only DeepSpeed-Inference's all-reduce uses
        # it (deepspeed/comm/torch.py: inference_all_reduce), never training, so the op is marked unavailable
        # and nothing is built mid-run ("edits to it persist": deepspeed/ops/__init__.py)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=ds.dist_backend, timeout=collective.set_timeout(ds.timeout_minutes))
    if not _DESTROY_AT_EXIT:
        _DESTROY_AT_EXIT.append(atexit.register(_destroy_process_groups))


_DESTROY_AT_EXIT: list[Callable[[], None]] = []  # registered once


def run_then_exit(main: Callable[..., Any], *args: Any) -> None:
    """Run a program's ``main(*args)`` and end the process. One that joined a process group (init_distributed) ends
    by ``os._exit`` once ``main`` and every atexit handler have run (the groups destroyed, the outputs closed,
    the streams flushed), with the exit status Python would give (0; a SystemExit's code; 1 and the traceback
    for an uncaught exception), never through the interpreter's finalization: DeepSpeed's engine, its parameters
    and its groups module hold the gloo groups, and so their worker threads, until finalization tears the
    modules down, and there a rank died of SIGABRT ("terminate called without an active exception") after
    writing every output (CI, a ZeRO-3 test's two ranks; here 1 run of 12 with the CPUs busy). A process that
    never joined a group exits as Python does."""
    try:
        main(*args)
        code = 0
    except BaseException as error:
        if not _DESTROY_AT_EXIT:
            raise
        if not isinstance(error, SystemExit):
            traceback.print_exc()
            code = 1
        elif isinstance(error.code, int | None):
            code = error.code or 0
        else:
            print(error.code, file=sys.stderr)
            code = 1
    if not _DESTROY_AT_EXIT:
        return
    atexit._run_exitfuncs()  # ours destroys the groups; the others close what they opened (extraction workers, logs)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _destroy_process_groups() -> None:
    """At exit, while the interpreter is whole: destroy every process group, torch's advice for every backend
    (a gloo group's shutdown is local: a rank that finishes first does not wait for the others). It does not end
    the gloo groups' worker threads while DeepSpeed still holds the groups (its engine, parameters and groups
    module), and a rank whose finalization met them died of SIGABRT ("terminate called without an active
    exception") after its work was done (CI, a ZeRO-3 test): run_then_exit leaves without finalization."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def deepspeed_config(ds: DeepSpeedConfig, world: int, *, dtype: str, grad_clip: float, micro_batch: int = 1,
                     accumulation: int = 1, caller_steps: bool = False) -> dict[str, Any]:
    """The DeepSpeed config dict (no JSON file needed): ``ds``'s ZeRO stage and offload, ``micro_batch`` rows
    per forward, ``accumulation`` micro-batches per optimizer step on each of ``world`` ranks, bf16 when
    ``dtype`` resolves to it here, gradient clipping (0 = off). ``caller_steps``: every ``engine.step()``
    is an optimizer step after however many backwards (DeepSpeed's managed_gradient_accumulation off)."""
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.zero_stage == 3:
        zero.update(stage3_gather_16bit_weights_on_model_save=False)
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": micro_batch * accumulation * world,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": resolve_dtype(dtype, default_device(), train=True) == torch.bfloat16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }
    if caller_steps:
        config["managed_gradient_accumulation"] = False
    return config


def zero3_loading(ds: DeepSpeedConfig, section: str, **settings: Any) -> Any:
    """Hold the returned object while calling ``from_pretrained`` (then drop it): with ZeRO-3 each rank then
    loads only its shard of the weights instead of a full copy. None when ZeRO-3 is off. ``settings``: as
    for ``deepspeed_config``; ``section`` names the params section in errors."""
    if not (ds.enabled and ds.zero_stage == 3):
        return None
    require_deepspeed(section)
    init_distributed(ds)
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    return HfDeepSpeedConfig(deepspeed_config(ds, torch.distributed.get_world_size(), **settings))


def deepspeed_init(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ds: DeepSpeedConfig,
                   lr_lambda: Callable[[int], float] | None = None, **settings: Any) -> tuple[Any, Any]:
    """(DeepSpeed engine, its LR scheduler) around ``model`` and ``optimizer`` (DeepSpeed's CPUAdam when
    ``ds.offload_optimizer``); the scheduler, stepped by DeepSpeed with the optimizer, is None without
    ``lr_lambda``. ``settings``: as for ``deepspeed_config``."""
    init_distributed(ds)
    import deepspeed

    world = torch.distributed.get_world_size()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda) if lr_lambda is not None else None
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=deepspeed_config(ds, world, **settings))
    kill_point("deepspeed")  # the kill harness (coa.launch): right after DeepSpeed's init
    return engine, scheduler


def deepspeed_inference(model: torch.nn.Module, ds: DeepSpeedConfig, **settings: Any) -> Any:
    """A DeepSpeed engine around ``model`` with no optimizer, for forwards only (RL's frozen reference): its
    parameters frozen, in eval mode, in DeepSpeed's dtype (bf16 under ``settings``' bf16). Under ZeRO-3 they stay
    partitioned over the ranks (a model loaded under ``zero3_loading`` already is; any other is partitioned by
    DeepSpeed) and each forward gathers one module at a time, as the policy's engine does: every rank must run
    the same forwards (a collective). ``settings``: as for ``deepspeed_config``."""
    init_distributed(ds)
    import deepspeed

    model.requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(model=model, config=deepspeed_config(ds, torch.distributed.get_world_size(),
                                                                                **settings))
    engine.eval()
    return engine


def _fresh_model(module: torch.nn.Module, dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """An uninitialised model of ``module``'s class and config in ``dtype`` and its tensors by state-dict name
    (each parameter once, as ``named_parameters``; persistent buffers)."""
    from transformers.initialization import no_init_weights

    with no_init_weights():
        fresh = type(module)._from_config(module.config, dtype=dtype)
    tensors = dict(fresh.named_parameters())
    for prefix, sub in fresh.named_modules():
        skip = getattr(sub, "_non_persistent_buffers_set", set())
        tensors.update((f"{prefix}.{n}" if prefix else n, b) for n, b in sub.named_buffers(recurse=False)
                       if n not in skip and b is not None)
    return fresh, tensors


def _finished(fresh: torch.nn.Module, module: torch.nn.Module, filled: set[str]) -> torch.nn.Module:
    """``fresh`` with its tied weights tied and ``module``'s generation config; an error naming any parameter
    that got no value (a tied one counts once, under its first name)."""
    fresh.tie_weights()
    missing = sorted(n for n, _ in fresh.named_parameters() if n not in filled)
    if missing:
        raise RuntimeError(f"gathering the DeepSpeed model: no weights came for {missing}")
    fresh.generation_config = module.generation_config
    return fresh


def gathered_model(engine: Any, rank: int, dtype: torch.dtype | None = None) -> torch.nn.Module | None:
    """The trained model whole on rank 0, None on the others (a collective: every rank calls), in ``dtype``:
    by default the dtype its module trains in (bf16 under DeepSpeed's bf16 mode: DeepSpeed keeps the bf16
    weights equal to its float32 master weights rounded; float32 in a float32 run).

    Module by module (``module_weights``: under ZeRO-3 one submodule's shards gathered at a time) straight into
    a fresh model of that dtype on rank 0: host memory holds that one copy (2 B/param in bf16: 65 GB at 32B),
    never a float32 state dict beside a float32 model. ``engine``: a DeepSpeed engine or its module."""
    module = getattr(engine, "module", engine)
    dtype = dtype or next(module.parameters()).dtype
    fresh, tensors = _fresh_model(module, dtype) if rank == 0 else (None, {})
    filled: set[str] = set()
    for chunk in module_weights(module):
        if rank == 0:
            for name, value in chunk:
                tensors[name].data.copy_(value)  # cast to dtype on the way (the same dtype by default)
                filled.add(name)
    return _finished(fresh, module, filled) if rank == 0 else None


def deepspeed_full_model(engine: Any, rank: int) -> torch.nn.Module | None:
    """The float32 master weights gathered into a fresh float32 model on rank 0, None on the others (a
    collective: every rank calls): SFT's final model. One parameter at a time, written straight into the model
    (no state dict beside it); a frozen parameter, which has no master copy, comes from the module (gathered)."""
    from deepspeed.utils import safe_get_full_fp32_param

    module = engine.module
    fresh, tensors = _fresh_model(module, torch.float32) if rank == 0 else (None, {})
    filled: set[str] = set()
    for name, p in module.named_parameters():
        full = safe_get_full_fp32_param(p)
        if full is None:
            with _gathered([p]):
                if rank == 0:
                    tensors[name].data.copy_(p.detach())
        elif rank == 0:
            tensors[name].data.copy_(full)
        filled.add(name)
    if rank != 0:
        return None
    for name, b in module.named_buffers():
        if name in tensors and name not in filled:
            tensors[name].data.copy_(b)
    return _finished(fresh, module, filled)


Chunk = list[tuple[str, torch.Tensor]]


def module_weights(module: torch.nn.Module) -> Iterator[Chunk]:
    """``module``'s weights, one submodule at a time: per submodule, (state-dict name, tensor) of its own
    parameters (a tied one once, under its first name, as ``named_parameters``) and persistent buffers.

    Under ZeRO-3 the submodule's partitioned parameters are gathered for the duration of its chunk
    (``deepspeed.zero.GatheredParameters``, ``recurse=False`` style: only that submodule's own), so at most one
    submodule is whole on a rank at a time, never a full copy of the model. A collective: every rank iterates
    to the end, in the same order. The tensors are the module's own, valid until the next chunk is asked for:
    a consumer copies them (HFEngine.sync, VLLMEngine.sync)."""
    seen: set[int] = set()
    for prefix, sub in module.named_modules():
        params = [(n, p) for n, p in sub.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in params)
        skip = getattr(sub, "_non_persistent_buffers_set", set())
        buffers = [(n, b) for n, b in sub.named_buffers(recurse=False) if n not in skip and b is not None]
        if not params and not buffers:
            continue
        with _gathered([p for _, p in params]):
            yield [(f"{prefix}.{n}" if prefix else n, t.detach()) for n, t in params + buffers]


def _gathered(params: list[torch.nn.Parameter]) -> Any:
    """ZeRO-3's gather of ``params`` (their full values, read-only) for a block; nothing to do otherwise."""
    if not any(hasattr(p, "ds_id") for p in params):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
