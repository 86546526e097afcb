"""Time the int8 routes for one linear shape against the float32 forms, at several row counts,
interleaved and repeated (median and best of the repeats), and check which routes give a row
the same bits alone as inside a batch (the routes compared in docs/quantization.md):

    python scripts/int8_routes.py --shape 262144x640 --rows 1 8 32   # Gemma 3's readout
    python scripts/int8_routes.py --shape 2048x640 --rows 1 8 32     # its gate/up projections
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from backend.engine.int8_linear import int8_product, pack, quantize_rows  # noqa: E402


def routes(weight: torch.Tensor) -> dict:
    values, scales = quantize_rows(weight)
    packed = pack(values, scales)
    onednn = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dynamic = torch.ao.nn.quantized.dynamic.Linear(weight.shape[1], weight.shape[0])
        dynamic.set_weight_bias(
            torch.quantize_per_channel(
                weight, scales.double(), torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8
            ),
            None,
        )
    return {
        "float32 F.linear": lambda x: F.linear(x, weight),
        "float32 packed (oneDNN)": lambda x: torch.ops.mkldnn._linear_pointwise(
            x, onednn, None, "none", [], ""
        ),
        "int8 dynamic (fbgemm)": dynamic,
        "int8 dynamic, one row at a time": lambda x: torch.cat([dynamic(r[None]) for r in x]),
        "int8 per-row, fixed range (ours)": lambda x: int8_product(x, packed),
        "int8 _weight_int8pack_mm": lambda x: torch.ops.aten._weight_int8pack_mm(x, values, scales),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="262144x640", help="OUTxIN")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    out_features, in_features = (int(n) for n in args.shape.split("x"))
    torch.manual_seed(0)
    weight = torch.randn(out_features, in_features) * 0.05
    forms = routes(weight)
    print(f"{args.shape}, {torch.get_num_threads()} threads; ms: median (best) of {args.repeats}")
    with torch.inference_mode():
        batch = torch.randn(max(args.rows), in_features)
        for name, form in forms.items():
            full = form(batch)
            exact = all(torch.equal(form(batch[i : i + 1])[0], full[i]) for i in range(4))
            print(f"  {name}: rows exact alone and in a batch: {'yes' if exact else 'no'}")
        for rows in args.rows:
            x = batch[:rows]
            times: dict[str, list[float]] = {name: [] for name in forms}
            for _ in range(args.repeats):  # interleaved: a burst of load hits every route
                for name, form in forms.items():
                    start = time.perf_counter()
                    form(x)
                    times[name].append(1e3 * (time.perf_counter() - start))
            for name, taken in times.items():
                print(f"  M={rows:3d} {name}: {statistics.median(taken):.2f} ({min(taken):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
