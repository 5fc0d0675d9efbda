"""Hand-written code against the library way of doing the same job, timed in the same run.

Where lmshards writes something a well-kept library also does, the module says why in its
docstring; this script measures it, printing each ratio ``library / lmshards`` (above 1: the
hand-written code is faster). Both sides produce the same result, which the script checks
(the same bytes for tar headers; for random numbers, the same amount of output: numpy's
generators draw other values, which is why switching would change every shard's bytes).

- ``tar headers`` (:mod:`transforms.writing.tar_format`): the member headers of one shard through
  ``tarfile.TarInfo.tobuf``, one member at a time, against ``write_tar_columns`` writing the
  whole shard (headers, ``.npy`` headers, payloads, padding) to memory; and ``tarfile``'s own
  stream writer (``TarFile.addfile``) for the whole shard.
- ``random numbers`` (:mod:`transforms.objectives.randoms`): a block of rows, each drawing
  ``--draws`` uniforms and a random permutation of ``--draws`` values from its own key, as the
  objectives do: one :class:`~transforms.objectives.randoms.Randoms` array expression against
  one numpy ``Generator`` per row (``np.random.default_rng(key)``, numpy's public seeding:
  SeedSequence and PCG64; and ``Generator(Philox(key=key))``, numpy's counter-based one).

Best of ``--repeats`` interleaved rounds, CPU time of this process (steadier than wall time on
a shared machine).

    python -m benchmarks.bench_handwritten
    python -m benchmarks.bench_handwritten --rows 20000 --block 512 --repeats 7
"""

from __future__ import annotations

import argparse
import io
import tarfile
import time

import numpy as np

from schemas.examples import example_schema
from transforms.objectives.randoms import Randoms, random_order
from transforms.writing.columns import ExampleColumns
from transforms.writing.tar_format import write_tar_columns


def _cpu_seconds(function) -> float:
    start = time.process_time()
    function()
    return time.process_time() - start


def _shard(rows: int, seed: int) -> ExampleColumns:
    """A BART-like shard: variable-length ``inputs`` and ``targets`` of about 512 tokens."""
    rng = np.random.default_rng(seed)
    schema = example_schema("seq2seq")
    examples = [{"key": f"train-r-c{i:08d}-d0", "inputs": rng.integers(0, 32000, int(rng.integers(300, 520))),
                 "targets": rng.integers(0, 32000, int(rng.integers(300, 512)))} for i in range(rows)]
    return ExampleColumns.from_examples(examples, schema)


def _members(columns: ExampleColumns) -> list[tuple[str, bytes]]:
    """Every member (name, payload) of the shard, in the order the tar holds them."""
    from transforms.writing.tar_format import npy_bytes

    members = []
    for index in range(columns.count):
        row = columns.row(index)
        for column in sorted(columns.schema.array_columns):
            members.append((f"{row['key']}.{column}.npy", npy_bytes(np.asarray(row[column], dtype=np.int32))))
    return members


def _tobuf_headers(members: list[tuple[str, bytes]]) -> list[bytes]:
    headers = []
    for name, payload in members:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = len(payload), 0, 0o644, "", ""
        headers.append(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
    return headers


def _tarfile_shard(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(payload), 0, 0o644, "", ""
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _lmshards_shard(columns: ExampleColumns) -> bytes:
    buffer = io.BytesIO()
    write_tar_columns(buffer, columns)
    return buffer.getvalue()


def tar_headers(rows: int, repeats: int) -> None:
    columns = _shard(rows, seed=0)
    members = _members(columns)
    ours = _lmshards_shard(columns)
    theirs = _tarfile_shard(members)
    if ours != theirs:
        raise SystemExit("tar headers: write_tar_columns and tarfile wrote different bytes")
    headers = _tobuf_headers(members)
    offset = 0
    for header, (_, payload) in zip(headers, members):  # tobuf's headers are the shard's, byte for byte
        if ours[offset : offset + 512] != header:
            raise SystemExit("tar headers: tobuf gave other header bytes")
        offset += 512 + len(payload) + (-len(payload) % 512)
    best = {name: float("inf") for name in ("write_tar_columns", "tobuf", "tarfile")}
    for _ in range(repeats):
        for name, function in (("write_tar_columns", lambda: _lmshards_shard(columns)),
                               ("tobuf", lambda: _tobuf_headers(members)),
                               ("tarfile", lambda: _tarfile_shard(members))):
            best[name] = min(best[name], _cpu_seconds(function))
    base = best["write_tar_columns"]
    print(f"tar headers: {rows} examples, {len(members)} members, {len(ours) / 2**20:.1f} MiB")
    print(f"  write_tar_columns (whole shard)   {base * 1e3:8.1f} ms  1.00")
    print(f"  TarInfo.tobuf (headers alone)     {best['tobuf'] * 1e3:8.1f} ms  {best['tobuf'] / base:.2f}")
    print(f"  tarfile addfile (whole shard)     {best['tarfile'] * 1e3:8.1f} ms  {best['tarfile'] / base:.2f}")


def random_numbers(block: int, draws: int, repeats: int) -> None:
    keys = np.random.default_rng(1).integers(0, 2**63, block, dtype=np.uint64)
    key_list = [int(k) for k in keys]

    def ours():
        randoms = Randoms(keys)
        return randoms.uniforms(1, draws), random_order(randoms, 2, draws)

    def default_rng():
        out = []
        for key in key_list:
            generator = np.random.default_rng(key)
            out.append((generator.random(draws), generator.permutation(draws)))
        return out

    def philox():
        out = []
        for key in key_list:
            generator = np.random.Generator(np.random.Philox(key=key))
            out.append((generator.random(draws), generator.permutation(draws)))
        return out

    uniforms, orders = ours()
    first = default_rng()
    if uniforms.shape != (block, draws) or orders.shape != (block, draws) or len(first) != block:
        raise SystemExit("random numbers: the two ways drew different amounts")
    best = {name: float("inf") for name in ("randoms", "default_rng", "philox")}
    for _ in range(repeats):
        for name, function in (("randoms", ours), ("default_rng", default_rng), ("philox", philox)):
            best[name] = min(best[name], _cpu_seconds(function))
    base = best["randoms"]
    print(f"random numbers: a block of {block} rows, {draws} uniforms and a permutation of {draws} per row")
    print(f"  Randoms (one array expression)    {base * 1e3:8.2f} ms  1.00")
    print(f"  default_rng per row               {best['default_rng'] * 1e3:8.2f} ms  {best['default_rng'] / base:.2f}")
    print(f"  Generator(Philox(key)) per row    {best['philox'] * 1e3:8.2f} ms  {best['philox'] / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5000, help="examples of the tar shard")
    parser.add_argument("--block", type=int, default=512, help="rows of the random-number block")
    parser.add_argument("--draws", type=int, default=64, help="uniforms (and permutation size) per row")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; the best counts")
    args = parser.parse_args()
    tar_headers(args.rows, args.repeats)
    random_numbers(args.block, args.draws, args.repeats)


if __name__ == "__main__":
    main()
