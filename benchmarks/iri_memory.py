"""IRIs at ImageNet size on the CPU: where the time goes, with and without reusing freed
memory.

glibc returns every freed block above 32 MB to the kernel, so a front at 224 px, whose
activation buffers are hundreds of megabytes, faults in new pages at every step.
``stitchlab._allocator.keep_freed_memory`` (applied by IRI generation and the Stitcher on
the CPU) keeps them for reuse. Each variant runs in its own process
(the allocator setting is per process); ``today`` is the loop with the setting disabled.
Each process makes IRIs twice: a warm-up of one step (first-touch page faults, the
trace), then the timed run of ``--steps`` steps, whose user and system CPU time, minor
page faults and wall time are printed, with the ratios against today's loop.

The front is timm's ``tf_efficientnet_lite0`` at 224 px (``--weights``: a safetensors
file of its ImageNet weights; random weights otherwise, the same work per step) cut at
``--point``; the images are random.

    python benchmarks/iri_memory.py [--point blocks.3] [--batch 64] [--steps 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _child(args: argparse.Namespace) -> None:
    import timm
    import torch

    import stitchlab as sl
    from stitchlab import _allocator

    if args.variant == "today":
        _allocator._applied = False  # the setting stays off in this process
    torch.set_num_threads(args.threads)
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    if args.weights:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(args.weights))
    x = torch.rand(args.batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    sl.generate_iris(model, args.point, x, steps=1, tolerance=None)  # warm-up
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    sl.generate_iris(model, args.point, x, steps=args.steps, tolerance=None)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "wall": wall, "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime,
        "faults": r1.ru_minflt - r0.ru_minflt, "peak_gb": r1.ru_maxrss / 2**20,
    }))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--point", default="blocks.3")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", default=None)
    p.add_argument("--variant", choices=["today", "reuse"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return _child(args)
    rows = {}
    for variant in ("today", "reuse"):
        cmd = [sys.executable, __file__, "--variant", variant, "--point", args.point,
               "--batch", str(args.batch), "--steps", str(args.steps),
               "--threads", str(args.threads)] + (["--weights", args.weights] if args.weights
                                                  else [])  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"tf_efficientnet_lite0 at 224 px to {args.point}, {args.batch} images, "
          f"{args.steps} IRI steps, {args.threads} threads")  # fmt: skip
    print("variant  wall (s)  user (s)  system (s)  system share  minor faults  peak (GB)")
    for variant, r in rows.items():
        share = r["sys"] / max(r["user"] + r["sys"], 1e-9)
        print(f"{variant:<8} {r['wall']:8.1f}  {r['user']:8.1f}  {r['sys']:10.1f}  "
              f"{share:12.0%}  {r['faults']:12d}  {r['peak_gb']:9.1f}")  # fmt: skip
    t, u = rows["today"], rows["reuse"]
    print(f"ratio today / reuse: wall {t['wall'] / u['wall']:.2f}x, CPU time "
          f"{(t['user'] + t['sys']) / (u['user'] + u['sys']):.2f}x, page faults "
          f"{t['faults'] / max(u['faults'], 1):.0f}x")  # fmt: skip


if __name__ == "__main__":
    main()
