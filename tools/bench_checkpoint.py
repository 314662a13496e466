"""Benchmark: the `checkpoint` workload (docs/benchmarks.md).

Saves and restores the full ENCDEC-S train state — T5.1.1 shapes (vocab 32128,
emb 512, 8 x 64 heads, gated-GELU mlp 1024, 6 + 6 layers, untied logits) plus
T5X Adafactor slots (factored ``v_row`` / ``v_col`` for matrices, ``v`` for
vectors, 1-element placeholders) — about 70 M float32 parameters, built
directly as ``jax.Array``s (no model package needed). In the same process and
alternating round by round, it times:

* ``ours``: ``t5x.checkpointing.Checkpointer`` save (synchronous, from device
  arrays to a complete, renamed step folder) and restore (into the target's
  shapes), for each compression asked for (``--compression``); once as shipped
  (chunk checksums written, and verified on restore) and once without them
  (``no-checksums``), which gives the cost of integrity checking;
* ``raw-ts``: plain TensorStore zarr writes / reads of the same arrays with the
  same chunks and compressor, all in flight at once (the floor for the format);
* ``orbax``: ``orbax.checkpoint.StandardCheckpointer`` save (+ wait) / restore
  of the same pytree, when orbax-checkpoint is installed;
* ``async``: the seconds ``Checkpointer.save`` blocks the caller when saving
  asynchronously, against the full save time.

Throughput is state bytes / wall seconds; the table shows medians. On a shared
machine wall times spread widely on both sides, so each save and restore also
records the process CPU time (every thread, TensorStore's included) and the
calling thread's CPU time: the checksum work runs on the calling thread, and
TensorStore's threads do the same work with checksums or without, so the
calling thread's difference is the steadiest end-to-end figure. Differences are
given between the medians and as the median of each round's paired difference.
The checksum work is also timed directly (the CPU seconds of checksum work in
one save and one restore: digests, the manifest, the checks; see
``checksum_work``), and the time XXH3 alone takes to digest the state's bytes.
``--checksums-only`` runs only ours with and without checksums (more rounds per
minute). Usage:

    python tools/bench_checkpoint.py [--repeats 3] [--compression gzip,zstd]
        [--dir /tmp/x] [--json OUT] [--no-orbax] [--checksums-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from _peer import peak_rss_gib

from t5x.interfaces import unflatten
from t5x.launch import restart_with_malloc_defaults

VOCAB, EMB, HEADS, HEAD_DIM, MLP, LAYERS = 32128, 512, 8, 64, 1024, 6


def encdec_s_params() -> dict[str, tuple[int, ...]]:
    """Parameter shapes of T5.1.1 ENCDEC-S, keyed by slash-joined T5X names."""
    shapes: dict[str, tuple[int, ...]] = {"token_embedder/embedding": (VOCAB, EMB)}
    attn = {f"{n}/kernel": (EMB, HEADS * HEAD_DIM) for n in ("query", "key", "value")}
    attn["out/kernel"] = (HEADS * HEAD_DIM, EMB)
    mlp = {"wi_0/kernel": (EMB, MLP), "wi_1/kernel": (EMB, MLP), "wo/kernel": (MLP, EMB)}
    for stack, blocks in (
        ("encoder", ("attention",)),
        ("decoder", ("self_attention", "encoder_decoder_attention")),
    ):
        shapes[f"{stack}/relpos_bias/rel_embedding"] = (HEADS, 32)
        norms = ["pre_attention_layer_norm", "pre_mlp_layer_norm"]
        if stack == "decoder":
            norms = ["pre_self_attention_layer_norm", "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"]
        for i in range(LAYERS):
            for block in blocks:
                shapes.update({f"{stack}/layers_{i}/{block}/{k}": v for k, v in attn.items()})
            shapes.update({f"{stack}/layers_{i}/mlp/{k}": v for k, v in mlp.items()})
            shapes.update({f"{stack}/layers_{i}/{n}/scale": (EMB,) for n in norms})
        shapes[f"{stack}/{stack}_norm/scale"] = (EMB,)
    shapes["decoder/logits_dense/kernel"] = (EMB, VOCAB)
    return shapes


def make_train_state(seed: int = 0) -> dict:
    """ENCDEC-S params + Adafactor slots as device arrays (float32, normal noise)."""
    rng = np.random.default_rng(seed)
    params, slots = {}, {}
    for name, shape in encdec_s_params().items():
        params[name] = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
        one = jnp.zeros((1,), jnp.float32)
        if len(shape) >= 2:
            slots[name] = {
                "v_row": jnp.asarray(rng.random(shape[:-1], dtype=np.float32)),
                "v_col": jnp.asarray(rng.random(shape[:-2] + shape[-1:], dtype=np.float32)),
                "v": one,
                "m": one,
            }
        else:
            slots[name] = {
                "v_row": one,
                "v_col": one,
                "v": jnp.asarray(rng.random(shape, dtype=np.float32)),
                "m": one,
            }
    state = {
        "target": unflatten(params),
        "state": {"step": jnp.asarray(1000, jnp.int32), "param_states": unflatten(slots)},
    }
    jax.block_until_ready(state)
    return state


def _nbytes(state) -> int:
    return sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree.leaves(state))


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _timed_cpu(fn):
    """``(wall s, process CPU s (every thread, TensorStore's included), calling thread's CPU s, result)``.

    The checksum work runs on the calling thread, TensorStore's own work on its
    threads (the same with checksums or without), so the calling thread's CPU
    time shows the checksums' cost with less of the other threads' noise.
    """
    start, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, time.thread_time() - own, out


def ours_save_restore(state, root, step, compression, checksums=True):
    from t5x.checkpointing import Checkpointer, _integrity

    ckpt = Checkpointer(root, async_save=False, compression=compression, verify=checksums)
    _integrity.WRITE_CHECKSUMS = checksums
    try:
        save = _timed_cpu(lambda: ckpt.save(step, state))
    finally:
        _integrity.WRITE_CHECKSUMS = True
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    *restore, restored = _timed_cpu(
        lambda: jax.block_until_ready(ckpt.restore(step, target=target, shardings=shardings).state)
    )
    ok = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored))
    )
    ckpt.close()
    return save[:3], tuple(restore), ok


def ours_async_block(state, root, step, compression):
    from t5x.checkpointing import Checkpointer

    ckpt = Checkpointer(root, compression=compression)
    start = time.perf_counter()
    ckpt.save(step, state)
    blocked = time.perf_counter() - start
    ckpt.wait_until_finished()
    total = time.perf_counter() - start
    ckpt.close()
    return blocked, total


def checksum_work(state, root, step, compression) -> tuple[float, float]:
    """CPU seconds of checksum work in one save and one restore.

    Save: the seconds inside the functions that exist only for checksums
    (the chunk digests; gathering, building and writing the manifest). Restore:
    the seconds comparing chunk digests during a restore, plus how much longer
    the metadata checks take with verification than without (best of 3; the
    containment checks run either way).
    """
    import functools

    from t5x.checkpointing import Checkpointer, _array_checks, _integrity, _reader

    spent = {"save": 0.0, "restore": 0.0}
    phase = ["save"]

    def timed(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.thread_time()  # CPU time: waiting for a core while TensorStore works is no cost
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase[0]] += time.thread_time() - start

        return wrapper

    digests = _integrity.piece_digests
    write_manifest = Checkpointer._write_manifest  # all of the manifest: gathering, building, writing
    verify = _array_checks.ArrayCheck.verify
    try:
        _integrity.piece_digests = timed(digests)
        Checkpointer._write_manifest = timed(write_manifest)  # type: ignore[method-assign]
        _array_checks.ArrayCheck.verify = timed(verify)  # type: ignore[method-assign]
        ckpt = Checkpointer(root, async_save=False, compression=compression)
        ckpt.save(step, state)
        phase[0] = "restore"
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        shardings = jax.tree.map(lambda x: x.sharding, state)
        jax.block_until_ready(ckpt.restore(step, target=target, shardings=shardings).state)
        ckpt.close()
    finally:
        _integrity.piece_digests = digests
        Checkpointer._write_manifest = write_manifest  # type: ignore[method-assign]
        _array_checks.ArrayCheck.verify = verify  # type: ignore[method-assign]

    def metadata_seconds(check: bool) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.thread_time()
            _reader.read_sources(ckpt.step_dir(step), verify=check)
            best = min(best, time.thread_time() - start)
        return best

    spent["restore"] += max(0.0, metadata_seconds(True) - metadata_seconds(False))
    return spent["save"], spent["restore"]


def digest_seconds(state) -> float:
    """XXH3 over every array's bytes, as the checksums digest them (best of 3)."""
    from t5x.checkpointing._integrity import digest

    arrays = [np.asarray(x) for x in jax.tree.leaves(state) if np.ndim(x) > 0]
    return min(_timed(lambda: [digest(a) for a in arrays])[0] for _ in range(3))


def raw_ts_save_restore(state, root, compression):
    from t5x.checkpointing._specs import choose_chunk_shape, compressor_json

    leaves = [(i, np.asarray(x)) for i, x in enumerate(jax.tree.leaves(state)) if np.ndim(x) > 0]
    context = ts.Context({"file_io_concurrency": {"limit": 128}})

    def spec(i, x):
        return {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": f"{root}/{i}"},
            "metadata": {
                "shape": list(x.shape),
                "chunks": choose_chunk_shape(x.shape, x.dtype.itemsize),
                "dtype": x.dtype.str,
                "compressor": compressor_json(compression),
            },
        }

    def save():
        stores = [ts.open(spec(i, x), create=True, context=context) for i, x in leaves]
        writes = [s.result().write(x) for s, (_, x) in zip(stores, leaves)]
        for w in writes:
            w.result()

    def restore():
        stores = [
            ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": f"{root}/{i}"}}, context=context)
            for i, _ in leaves
        ]
        reads = [s.result().read() for s in stores]
        return [r.result() for r in reads]

    save_s, _ = _timed(save)
    restore_s, _ = _timed(restore)
    return save_s, restore_s


def orbax_save_restore(state, root):
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:

        def save():
            ckpt.save(os.path.join(root, "state"), state)
            ckpt.wait_until_finished()

        save_s, _ = _timed(save)
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        restore_s, _ = _timed(
            lambda: jax.block_until_ready(ckpt.restore(os.path.join(root, "state"), target))
        )
    return save_s, restore_s


def _paired(results, compression, kind, what) -> tuple[float, float]:
    """Median of the rounds' (with - without) differences, and of the rounds' relative ones."""
    with_ = results[f"ours[{compression}] {kind}{what}"]
    without = results[f"ours[{compression}, no-checksums] {kind}{what}"]
    return (
        statistics.median(a - b for a, b in zip(with_, without)),
        statistics.median((a - b) / b for a, b in zip(with_, without)),
    )


def _cost_line(results, medians, compression, kind) -> str:
    """What checksums add to a save or restore: wall, process CPU, calling thread's CPU, work inside."""
    parts = []
    for what, label in (("", "wall"), (" cpu", "process CPU"), (" thread cpu", "calling thread CPU")):
        with_s = medians[f"ours[{compression}] {kind}{what}"]
        without_s = medians[f"ours[{compression}, no-checksums] {kind}{what}"]
        diff, rel = _paired(results, compression, kind, what)
        parts.append(
            f"{label} {with_s:.3f} / {without_s:.3f} s ({100 * (with_s - without_s) / without_s:+.1f}% "
            f"of medians; paired per round {diff:+.3f} s, {100 * rel:+.1f}%)"
        )
    work = medians[f"ours[{compression}] checksum work in {kind}"]
    cpu_without = medians[f"ours[{compression}, no-checksums] {kind} cpu"]
    with_s = medians[f"ours[{compression}] {kind}"]
    return (
        f"ours[{compression}] {kind}, with / without checksums: " + "; ".join(parts) + f"; checksum work "
        f"measured inside: {work:.3f} CPU s ({100 * work / with_s:.1f}% of the {kind}'s wall, "
        f"{100 * work / cpu_without:.1f}% of its process CPU without checksums)"
    )


def memory_alone(side: str, compression: str, scratch: str, json_out: str | None) -> None:
    """One save and one restore by ``side`` in this process: its peak resident memory is theirs alone."""
    state = make_train_state()
    if side == "ours":
        _, _, ok = ours_save_restore(state, f"{scratch}/ours", 1, compression)
        assert ok, "restored values differ"
    else:
        orbax_save_restore(state, f"{scratch}/orbax")
    peak = peak_rss_gib()
    print(f"{side}: peak resident memory {peak:.2f} GiB (state {_nbytes(state) / 2**30:.2f} GiB)")
    if json_out:
        with open(json_out, "w") as handle:
            json.dump({"side": side, "peak_rss_gib": peak, "state_bytes": _nbytes(state)}, handle)
    shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    restart_with_malloc_defaults()  # glibc malloc settings, as under t5x-launch
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compression", default="gzip,zstd")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--no-orbax", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--checksums-only",
        action="store_true",
        help="only ours with and without checksums (no raw TensorStore, Orbax or async runs): more rounds per minute",
    )
    parser.add_argument(
        "--memory-of",
        choices=("ours", "orbax"),
        default=None,
        help="only build the state and save + restore it once with this side, for its peak memory alone",
    )
    args = parser.parse_args()
    compressions = args.compression.split(",")
    scratch = tempfile.mkdtemp(dir=args.dir, prefix="bench-ckpt-")
    if args.memory_of:
        memory_alone(args.memory_of, compressions[0], scratch, args.json)
        return
    try:
        import orbax.checkpoint  # noqa: F401

        have_orbax = not (args.no_orbax or args.checksums_only)
    except ImportError:
        have_orbax = False
    load_at_start = os.getloadavg()
    state = make_train_state()
    nbytes = _nbytes(state)
    mb = nbytes / 1e6
    print(
        f"ENCDEC-S train state: {sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state['target'])) / 1e6:.1f} M params, "
        f"{len(jax.tree.leaves(state))} arrays, {mb:.0f} MB; scratch {scratch}"
    )
    results: dict[str, list[float]] = {}
    loads: list[float] = []  # the 1-minute load average as each round starts (the machine may be shared)

    def add(key, value):
        results.setdefault(key, []).append(value)

    step = 0
    for round_index in range(args.repeats):
        loads.append(os.getloadavg()[0])
        for compression in compressions:
            # Saves slow down as the disk falls behind within a round: with and without
            # checksums take turns going first.
            for checksums in (True, False) if round_index % 2 == 0 else (False, True):
                step += 1
                save, restore, ok = ours_save_restore(
                    state, f"{scratch}/ours-{compression}", step, compression, checksums=checksums
                )
                assert ok, "restored values differ"
                label = compression if checksums else f"{compression}, no-checksums"
                for kind, (wall, cpu, thread) in (("save", save), ("restore", restore)):
                    add(f"ours[{label}] {kind}", wall)
                    add(f"ours[{label}] {kind} cpu", cpu)
                    add(f"ours[{label}] {kind} thread cpu", thread)
            step += 1
            save_s, restore_s = checksum_work(state, f"{scratch}/ours-{compression}", step, compression)
            add(f"ours[{compression}] checksum work in save", save_s)
            add(f"ours[{compression}] checksum work in restore", restore_s)
            if args.checksums_only:
                continue
            raw = f"{scratch}/raw-{compression}-{round_index}"
            save_s, restore_s = raw_ts_save_restore(state, raw, compression)
            shutil.rmtree(raw)
            add(f"raw-ts[{compression}] save", save_s)
            add(f"raw-ts[{compression}] restore", restore_s)
        if have_orbax:
            root = f"{scratch}/orbax-{round_index}"
            save_s, restore_s = orbax_save_restore(state, root)
            shutil.rmtree(root)
            add("orbax save", save_s)
            add("orbax restore", restore_s)
        for compression in compressions if not args.checksums_only else ():
            step += 1
            blocked, total = ours_async_block(state, f"{scratch}/async-{compression}", step, compression)
            add(f"ours[{compression}] async blocked", blocked)
            add(f"ours[{compression}] async total", total)
        for name in os.listdir(scratch):
            if name.startswith(("ours-", "async-")):
                shutil.rmtree(os.path.join(scratch, name))
        print(f"round {round_index + 1}/{args.repeats} done", flush=True)

    medians = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"\nload average {os.getloadavg()} (at the start {load_at_start}; 1-minute average as rounds "
        f"started: {min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}), {os.cpu_count()} CPUs, "
        f"jax {jax.__version__} ({jax.default_backend()})"
    )
    print(f"{'run':34} {'median s':>9} {'MB/s':>8} {'vs orbax':>9}")
    for key, seconds in medians.items():
        if "async" in key or "checksum work" in key or key.endswith(" cpu"):
            continue
        kind = key.rsplit(" ", 1)[1]
        ratio = ""
        if have_orbax and not key.startswith("orbax"):
            ratio = f"{medians[f'orbax {kind}'] / seconds:8.2f}x"
        print(f"{key:34} {seconds:9.3f} {mb / seconds:8.1f} {ratio:>9}")
    hashing = digest_seconds(state)
    print(f"XXH3 digests of all {mb:.0f} MB alone: {hashing:.3f} s ({mb / hashing / 1e3:.1f} GB/s)")
    for compression in compressions:
        for kind in ("save", "restore"):
            print(_cost_line(results, medians, compression, kind))
    for compression in compressions if not args.checksums_only else ():
        blocked = medians[f"ours[{compression}] async blocked"]
        total = medians[f"ours[{compression}] async total"]
        print(
            f"ours[{compression}] async save: caller blocked {blocked:.3f} s of {total:.3f} s "
            f"({100 * blocked / total:.1f}%)"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "bytes": nbytes,
                    "loadavg": os.getloadavg(),
                    "loadavg_at_start": load_at_start,
                    "loadavg_per_round": loads,
                    "seconds": results,
                    "medians": medians,
                },
                handle,
                indent=1,
            )
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
