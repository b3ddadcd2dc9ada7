"""How fast a profile's matrix products ran, by shape, against the matmul ceiling.

Shared by :mod:`benchmarks.profile_training` and :mod:`benchmarks.profile_decoding`
(``--products``) and ``make bench``'s "where the time goes". A profile grouped by input shape
(``key_averages(group_by_input_shape=True)``) has one row per product shape, hundreds of them
because the batch size changes from batch to batch and step to step. The dimensions that are
not the size of one of the model's parameters or buffers (the rows of a batch, a source length)
are written ``n``, so the rows of one product merge whatever the batch: ``(n, 512) x (512,
4288)`` is the output layer's forward product, ``(4288, n) x (n, 512)`` its weight gradient.
That is a heuristic: a batch that happens to have a parameter's size gets a class of its own.

The table answers the first question of a slow run (do the products run slowly, or does the
time go elsewhere?): each class's share of the operators' time (torch.profiler's self CPU
time, summed over every operator; Python between operators is not in it), its GFLOP/s and the
percentage of the ceiling measured in the same run; its last line, the products' total against
everything else. Counted: ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` and the
matrix-vector ``mv`` / ``addmv`` (memory-bound, so far below the ceiling). Not counted:
oneDNN's fused LSTM layers, which stay in "everything else". The ceiling is the run's
precision's: under bf16 autocast a product autocast leaves in float32 shows well below it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PRODUCT_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv")
# The operators that take the added tensor first.
ADDING_OPS = ("aten::addmm", "aten::baddbmm", "aten::addmv")
BATCHED_OPS = ("aten::bmm", "aten::baddbmm")


@dataclass
class ProductClass:
    """The products of one shape class: ``label`` as ``(M, K) x (K, N)``; ``mean_n`` is the
    mean size of its first ``n`` dimension (the rows of a batch for a layer's products and
    their weight gradients), None where every dimension is a parameter's."""

    label: str
    calls: int = 0
    seconds: float = 0.0
    flop: float = 0.0
    n_total: int = 0  # the summed sizes of the first n dimension, over calls
    n_count: int = 0  # the calls n_total sums

    @property
    def mean_n(self) -> float | None:
        return self.n_total / self.n_count if self.n_count else None


def product_dims(name: str, input_shapes: list) -> tuple[int, int, int, int] | None:
    """``(batch, M, K, N)`` of one product operator's inputs, None for any other operator.

    ``batch`` is 1 for 2-D products; a matrix-vector product has ``N = 1``.
    """
    if name not in PRODUCT_OPS:
        return None
    shapes = input_shapes[1:3] if name in ADDING_OPS else input_shapes[:2]
    if len(shapes) < 2 or len(shapes[0]) < 2 or not shapes[1]:
        return None
    left, right = shapes
    batch = left[0] if name in BATCHED_OPS else 1
    return batch, left[-2], left[-1], right[-1] if len(right) > 1 else 1


def product_classes(events, fixed_dims: set[int]) -> tuple[list[ProductClass], float]:
    """The product classes of ``events`` (profiler averages grouped by input shape), slowest
    first, and the operators' whole self time in seconds.

    ``fixed_dims`` are the sizes of the model's parameters and buffers: any other dimension is
    ``n``.
    """

    def name(size: int) -> str:
        return str(size) if size in fixed_dims else "n"

    classes: dict[str, ProductClass] = {}
    total = 0.0
    for event in events:
        seconds = event.self_cpu_time_total / 1e6
        total += seconds
        dims = product_dims(event.key, event.input_shapes)
        if dims is None:
            continue
        batch, m, k, n = dims
        if event.key in ("aten::mv", "aten::addmv"):
            label = f"({name(m)}, {name(k)}) x ({name(k)})"
        else:
            label = f"({name(m)}, {name(k)}) x ({name(k)}, {name(n)})"
        if event.key in BATCHED_OPS:
            label = f"bmm {name(batch)} x {label}"
        found = classes.setdefault(label, ProductClass(label))
        found.calls += event.count
        found.seconds += seconds
        found.flop += 2.0 * batch * m * k * n * event.count
        varying = [size for size in (m, k, n) if size not in fixed_dims]
        if varying:
            found.n_total += varying[0] * event.count
            found.n_count += event.count
    return sorted(classes.values(), key=lambda c: -c.seconds), total


def product_report(events, *, fixed_dims: set[int], ceiling: float | None, rows: int = 15) -> str:
    """A table of the ``rows`` slowest product classes of ``events`` and a summary line (see
    the module).

    ``ceiling`` is the matmul ceiling of the products' precision in GFLOP/s, None where it was
    not measured (emulated bf16): the percentage columns are then left out.
    """
    return format_report(*product_classes(events, fixed_dims), ceiling=ceiling, rows=rows)


def format_report(classes: list[ProductClass], total: float, *, ceiling: float | None,
                  rows: int = 15) -> str:
    """:func:`product_report` from :func:`product_classes`' result."""
    if total <= 0:
        return "no operator time in this profile: nothing to report"
    lines = [f"{'product (n: batch rows or positions)':<42} {'calls':>6} {'mean n':>7} "
             f"{'s':>7} {'% time':>7} {'GFLOP':>8} {'GFLOP/s':>8} {'% ceiling':>9}"]

    def percent(rate: float) -> str:
        return f"{100 * rate / ceiling:8.0f}%" if ceiling else f"{'-':>9}"

    for found in classes[:rows]:
        rate = found.flop / found.seconds / 1e9 if found.seconds else 0.0
        mean_n = f"{found.mean_n:>7.0f}" if found.mean_n is not None else f"{'-':>7}"
        lines.append(f"{found.label:<42} {found.calls:>6} {mean_n} {found.seconds:>7.2f} "
                     f"{100 * found.seconds / total:>6.1f}% {found.flop / 1e9:>8.1f} "
                     f"{rate:>8.1f} {percent(rate)}")
    lines.append(summary_line(product_summary(classes, total, ceiling)))
    return "\n".join(lines)


def product_summary(classes: list[ProductClass], total: float, ceiling: float | None) -> dict:
    """All products together: their seconds and share of the profile's ``total`` seconds, their
    GFLOP/s and (with a ``ceiling``) its percentage, as ``make bench`` records them."""
    seconds = sum(found.seconds for found in classes)
    rate = sum(found.flop for found in classes) / seconds / 1e9 if seconds else 0.0
    return {
        "product_seconds": seconds,
        "total_seconds": total,
        "product_share": seconds / total if total else 0.0,
        "product_gflops": rate,
        "ceiling_gflops": ceiling,
        "product_percent_of_ceiling": 100 * rate / ceiling if ceiling and seconds else None,
    }


def summary_line(summary: dict) -> str:
    """One line for :func:`product_summary`'s numbers."""
    seconds, total = summary["product_seconds"], summary["total_seconds"]
    if not seconds:
        return f"no matrix products among {total:.2f} s of operator time"
    percent = summary["product_percent_of_ceiling"]
    share = (f" = {percent:.0f}% of the ceiling ({summary['ceiling_gflops']:.0f})"
             if percent is not None else "")
    return (f"all products: {seconds:.2f} s of {total:.2f} s of operator time "
            f"({100 * summary['product_share']:.0f}%) at {summary['product_gflops']:.1f} "
            f"GFLOP/s{share}; everything else {total - seconds:.2f} s "
            f"({100 * (1 - summary['product_share']):.0f}%)")


def parameter_dims(model) -> set[int]:
    """Every size of every parameter and buffer of ``model``: the dimensions that are not
    ``n``."""
    tensors = [*model.parameters(), *model.buffers()]
    return {size for tensor in tensors for size in tensor.shape}


def add_product_options(parser) -> None:
    """The profile scripts' ``--products``, ``--ceiling`` and ``--json`` options."""
    parser.add_argument("--products", action="store_true",
                        help="also the matrix products by shape against the matmul ceiling")
    parser.add_argument("--ceiling", type=float, default=None,
                        help="the matmul ceiling in GFLOP/s, measured first if not given")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the products' summary there (implies --products)")


def print_products(events, model, precision: str, *, ceiling: float | None = None,
                   json_path: Path | None = None) -> dict:
    """Print :func:`product_report` for a profile of ``model`` in ``precision``, measuring the
    matmul ceiling first unless ``ceiling`` (GFLOP/s) is given, and write
    :func:`product_summary` to ``json_path`` when given. Returns that summary.

    ``events``: ``profiler.key_averages(group_by_input_shape=True)``.
    """
    if ceiling is None:
        from benchmarks.bench import matmul_ceilings

        ceilings, line = matmul_ceilings()
        print(line)
        ceiling = ceilings.get(precision)
    classes, total = product_classes(events, parameter_dims(model))
    print(format_report(classes, total, ceiling=ceiling))
    summary = product_summary(classes, total, ceiling)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2))
    return summary
