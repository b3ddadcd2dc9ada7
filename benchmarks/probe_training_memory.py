"""Where a training run's resident memory is: malloc's heap, file maps, anonymous maps.

    python -m benchmarks.probe_training_memory experiment=multi30k_luong_fast \\
        trainer.max_steps=200 [--report-every 25] [--trim-every N] [--run-dir DIR]

Trains exactly as ``train.py`` does (the same config, composed from the same Hydra overrides,
the same oneDNN cache bound) and after every ``--report-every`` optimizer steps (torch's global
optimizer step hook: the trainer is not touched) prints the process's resident memory, glibc's
view of its heap (``mallinfo2``: bytes in use, bytes freed but kept) and the largest mappings
by resident size (``/proc/self/smaps``: a memory-mapped corpus shows up under its file name).
``--trim-every N`` calls ``malloc_trim(0)`` after every N steps, to see what handing freed heap
back to the system costs in speed (Linux with glibc).
Peak memory: run it under ``/usr/bin/time -v`` and read "Maximum resident set size".
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from torch.optim.optimizer import register_optimizer_step_post_hook

from seq2seq import CONFIG_DIR
from seq2seq.onednn_caches import bound_onednn_caches
from seq2seq.training.run import train

GIB = 2**30


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def largest_mappings(count: int) -> list[tuple[str, float]]:
    """The ``count`` mapped files (or [heap], [anon]) with the most resident GiB."""
    resident: dict[str, int] = {}
    name = "[anon]"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode [path]
                name = fields[5] if len(fields) > 5 else "[anon]"
            elif fields[0] == "Rss:":
                resident[name] = resident.get(name, 0) + int(fields[1]) * 1024
    ranked = sorted(resident.items(), key=lambda item: -item[1])[:count]
    return [(path, size / GIB) for path, size in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.py")
    parser.add_argument("--report-every", type=int, default=25, help="optimizer steps")
    parser.add_argument("--trim-every", type=int, default=0, help="malloc_trim(0) every N steps")
    parser.add_argument("--mappings", type=int, default=6, help="largest mappings listed")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a temporary one")
    args = parser.parse_args()
    if args.report_every < 1 or args.trim_every < 0:
        parser.error("--report-every must be positive and --trim-every not negative")
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    bound_onednn_caches()
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")

    steps = 0

    def probe(optimizer, positional, keywords) -> None:
        """After every optimizer step of the run."""
        nonlocal steps
        steps += 1
        if args.trim_every and steps % args.trim_every == 0:
            libc.malloc_trim(0)
        if steps % args.report_every == 0:
            heap = libc.mallinfo2()
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            print(f"step {steps}: resident {pages * 4096 / GIB:.2f} GiB, heap in use "
                  f"{heap.uordblks / GIB:.2f} GiB, freed but kept {heap.fordblks / GIB:.2f} GiB",
                  flush=True)
            for path, size in largest_mappings(args.mappings):
                print(f"    {size:6.2f} GiB  {path}", flush=True)

    register_optimizer_step_post_hook(probe)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=args.overrides)
    with tempfile.TemporaryDirectory(prefix="probe-") as temporary:
        train(cfg, args.run_dir or Path(temporary))


if __name__ == "__main__":
    main()
