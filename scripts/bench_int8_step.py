#!/usr/bin/env python
"""The int8 TFT training step against the fp32 one (issue 41's goal: int8 <= 1.25x fp32).

Usage: ``python scripts/bench_int8_step.py [--steps 8] [--warmup 3] [--threads 1]
[--variant NAME=OVERRIDE,OVERRIDE ...] [--profile]`` or ``python scripts/bench_int8_step.py --parts``.

The TFT at its configured size (``conf/model/tft.yaml``) is built once per variant as
``foxhunt-train`` builds it (same seed, so the same initial weights), its weights and optimizer
put under the variant's precision policy by the Trainer plugin's own helpers
(:func:`foxhunt.precision.quantize.quantize_model`, :func:`foxhunt.precision.optim.convert_optimizer`),
and trained on random batches of the configured shape (``model.window``: batch, ``seq_len`` past
and ``horizon`` future bars), the same batch for every variant at each step. The variants
alternate step by step in one process (load drifts hit them alike); each step is timed in process
CPU time as forward + backward and ``optimizer.step()`` apart. The figures are the medians of
``--steps`` steps after ``--warmup`` steps (the first steps compile the optimizer's update), and
each variant's ratio to the first (``fp32``). The load average before and after is printed with
them: the machine may be shared.

Variants: ``fp32`` (``precision=fp32``) and ``int8`` (``precision=int8``) unless ``--variant`` is
given; ``--variant int8-eager=precision=int8,precision.compile_optimizer=false`` adds one (its
overrides are Hydra overrides of ``conf/train.yaml``). ``--profile`` prints torch.profiler's table
of one more optimizer step of each variant but the first.

``--parts`` times the parts of the 8-bit update instead, in nanoseconds per element of one
``--rows`` x ``--columns`` matrix (1024 x 256, the TFT's largest shape; its tensors are hot in
the cache, unlike a model's): each part torch.compile'd alone, medians of ``--steps`` calls after
``--warmup``, process CPU time. :func:`foxhunt.precision.eight_bit_step.adam_update` with fp32
weight and states (Adam's math), with fp8 states (plus the states' dequantization and block-absmax
re-quantization) and with an int8 weight (plus its per-row re-quantization with stochastic
rounding); the parts alone; and, for comparison, torchao's update of an int8 weight with fp8 states
(``AdamWFp8``, compiled: what the step ran before) and torch's fused AdamW.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_VARIANTS = ["fp32=precision=fp32", "int8=precision=int8"]


@dataclass
class Variant:
    name: str
    overrides: list[str]
    model: Any = None  # the TFT LightningModule
    optimizer: torch.optim.Optimizer | None = None
    forward_backward_ms: list[float] = field(default_factory=list)
    optimizer_ms: list[float] = field(default_factory=list)

    @property
    def step_ms(self) -> list[float]:
        return [a + b for a, b in zip(self.forward_backward_ms, self.optimizer_ms)]


def _parse_variant(text: str) -> Variant:
    name, _, overrides = text.partition("=")
    if not name or not overrides:
        raise SystemExit(f"--variant {text!r}: expected NAME=OVERRIDE[,OVERRIDE...]")
    return Variant(name, overrides.split(","))


def _build(variant: Variant) -> None:
    from hydra.utils import instantiate

    from foxhunt.precision.optim import convert_optimizer
    from foxhunt.precision.quantize import quantize_model
    from foxhunt.training.parts import build_model, compose_config

    cfg = compose_config(["model=tft", "logger=none", *variant.overrides])
    policy = instantiate(cfg.precision)
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg)
    model.train()
    quantize_model(model, policy)
    variant.model = model
    variant.optimizer = convert_optimizer(model.configure_optimizers(), policy)
    variant.cfg = cfg  # type: ignore[attr-defined]


def _batch(cfg, step: int) -> dict[str, torch.Tensor]:
    """A random batch of the configured shape (the same for every variant at ``step``)."""
    module, window = cfg.model.module, cfg.model.window
    batch, past, future = int(window.batch_size), int(window.seq_len), int(window.horizon)
    generator = torch.Generator().manual_seed(1_000 + step)
    return {
        "static": torch.randn(batch, int(module.static_dim), generator=generator),
        "known": torch.randn(batch, past + future, int(module.known_dim), generator=generator),
        "observed": torch.randn(batch, past, int(module.observed_dim), generator=generator),
        "target": torch.randn(batch, future, generator=generator),
    }


def _step(variant: Variant, batch: dict[str, torch.Tensor]) -> tuple[float, float]:
    """One training step; (forward + backward, optimizer step) in CPU milliseconds."""
    model, optimizer = variant.model, variant.optimizer
    assert model is not None and optimizer is not None
    optimizer.zero_grad(set_to_none=True)
    start = time.process_time()
    loss, _ = model._loss(batch)
    loss.backward()
    middle = time.process_time()
    optimizer.step()
    end = time.process_time()
    return 1e3 * (middle - start), 1e3 * (end - middle)


def _profile(variant: Variant, batch: dict[str, torch.Tensor]) -> None:
    from torch.profiler import ProfilerActivity, profile

    model, optimizer = variant.model, variant.optimizer
    assert model is not None and optimizer is not None
    optimizer.zero_grad(set_to_none=True)
    loss, _ = model._loss(batch)
    loss.backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        optimizer.step()
    print(f"\n# torch.profiler: {variant.name} optimizer.step()")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def _per_element_ns(function, arguments: tuple, numel: int, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        function(*arguments)
    times = []
    for _ in range(steps):
        start = time.process_time()
        function(*arguments)
        times.append(time.process_time() - start)
    return 1e9 * statistics.median(times) / numel


def _parts(rows: int, columns: int, steps: int, warmup: int) -> list[tuple[str, float]]:
    """ns per element of the 8-bit update's parts (see the module doc), each compiled alone."""
    from torchao.optim import AdamWFp8
    from torchao.optim.subclass_fp8 import quantize_fp8

    from foxhunt.precision import eight_bit_step as update
    from foxhunt.precision.quantize import int8_weight

    def compiled(function):
        return torch.compile(function, fullgraph=True, dynamic=False)

    generator = torch.Generator().manual_seed(0)
    shape, numel, block = (rows, columns), rows * columns, 256
    weight = torch.randn(shape, generator=generator)
    grad = torch.randn(shape, generator=generator) * 1e-3
    fp8 = [quantize_fp8(torch.randn(shape, generator=generator).abs() * 1e-4, block) for _ in range(2)]
    int8 = update.requantize_rows(weight, torch.tensor([1, 2], dtype=torch.int32))
    hyper = (torch.tensor(3.0), torch.tensor(1e-3), torch.tensor([1, 2], dtype=torch.int32), 0.9, 0.999, 1e-3, 1e-8, True)
    adam = compiled(update.adam_update)
    rows_out = [
        ("adam_update: fp32 weight, fp32 states (Adam's math)",
         _per_element_ns(adam, ((weight.clone(),), grad, (grad.clone(),), (grad.abs(),), None, *hyper), numel, steps, warmup)),
        ("adam_update: fp32 weight, fp8 states (+ states' dequant and requant)",
         _per_element_ns(adam, ((weight.clone(),), grad, fp8[0], fp8[1], None, *hyper), numel, steps, warmup)),
        ("adam_update: int8 weight, fp8 states (+ weight requant, stochastic rounding)",
         _per_element_ns(adam, (int8, grad, fp8[0], fp8[1], None, *hyper), numel, steps, warmup)),
        ("  fp8 state dequant alone",
         _per_element_ns(compiled(lambda c, s: (c.float().view(-1, block) * s.view(-1, 1)).view(c.shape)), fp8[0], numel, steps, warmup)),
        ("  fp8 state requant alone (block absmax)",
         _per_element_ns(compiled(lambda v: quantize_fp8(v, block)), (grad,), numel, steps, warmup)),
        ("  int8 weight requant alone (row absmax, stochastic rounding)",
         _per_element_ns(compiled(update.requantize_rows), (weight, hyper[2]), numel, steps, warmup)),
        ("  its draws alone (counter-based hash)",
         _per_element_ns(compiled(update.uniform), (hyper[2], torch.Size(shape)), numel, steps, warmup)),
        ("  torch.rand_like alone (torchao's draws)",
         _per_element_ns(compiled(torch.rand_like), (weight,), numel, steps, warmup)),
    ]  # fmt: skip
    parameter = torch.nn.Parameter(int8_weight(weight))
    parameter.grad = grad
    torchao = AdamWFp8([parameter], lr=1e-3, weight_decay=1e-3)
    rows_out.append(("torchao AdamWFp8 step, int8 weight (before)", _per_element_ns(torchao.step, (), numel, steps, warmup)))
    plain = torch.nn.Parameter(weight.clone())
    plain.grad = grad
    fused = torch.optim.AdamW([plain], lr=1e-3, weight_decay=1e-3, fused=True)
    rows_out.append(("torch fused AdamW step, fp32", _per_element_ns(fused.step, (), numel, steps, warmup)))
    return rows_out


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--variant", action="append", help="NAME=OVERRIDE[,OVERRIDE...]; the first is the reference")
    parser.add_argument("--profile", action="store_true", help="torch.profiler table of one more optimizer step")
    parser.add_argument("--parts", action="store_true", help="ns per element of the 8-bit update's parts instead")
    parser.add_argument("--rows", type=int, default=1024, help="--parts: the matrix's rows")
    parser.add_argument("--columns", type=int, default=256, help="--parts: the matrix's columns")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.parts:
        load_before = _load()
        measured = _parts(args.rows, args.columns, args.steps, args.warmup)
        print(f"# 8-bit update parts: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
              f"{args.threads} thread(s), {args.rows} x {args.columns}, median of {args.steps} after {args.warmup}, process CPU time")  # fmt: skip
        print(f"# load average (1/5/15 min) before {load_before}, after {_load()}")
        for name, ns in measured:
            print(f"{name:<80} {ns:>7.2f} ns/element")
        return 0
    variants = [_parse_variant(text) for text in args.variant or DEFAULT_VARIANTS]
    for variant in variants:
        _build(variant)
    cfg = variants[0].cfg  # type: ignore[attr-defined]
    load_before = _load()
    started = datetime.datetime.now(datetime.UTC)
    for step in range(args.warmup + args.steps):
        batch = _batch(cfg, step)
        for variant in variants:
            forward_backward, optimizer = _step(variant, batch)
            if step >= args.warmup:
                variant.forward_backward_ms.append(forward_backward)
                variant.optimizer_ms.append(optimizer)
    load_after = _load()

    print(f"# int8 TFT step: {started:%Y-%m-%d %H:%M} UTC, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.threads} thread(s), "
          f"batch {cfg.model.window.batch_size}, median of {args.steps} steps after {args.warmup}, process CPU time")  # fmt: skip
    print(f"# load average (1/5/15 min) before {load_before}, after {load_after}")
    reference = statistics.median(variants[0].step_ms)
    print(f"{'variant':<16} {'step ms':>9} {'fwd+bwd ms':>11} {'optim ms':>9} {'step/' + variants[0].name:>11}")
    for variant in variants:
        step_ms = statistics.median(variant.step_ms)
        print(f"{variant.name:<16} {step_ms:>9.1f} {statistics.median(variant.forward_backward_ms):>11.1f} "
              f"{statistics.median(variant.optimizer_ms):>9.1f} {step_ms / reference:>10.3f}x")  # fmt: skip
    if args.profile:
        batch = _batch(cfg, args.warmup + args.steps)
        for variant in variants[1:]:
            _profile(variant, batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
