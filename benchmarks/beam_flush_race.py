"""Beam's FnApiRunner loses stage input with local worker processes: the evidence, without lmshards.

Two demonstrations of the cause that :mod:`pipelines.file_handoff` works around:

``--stream``: Beam's ``TimeBasedBufferingClosableOutputStream`` (the runner's data stream to an
SDK worker: ``BeamFnDataServicer`` is created with ``DATA_BUFFER_TIME_LIMIT_MS`` = 1000). Its
timer thread flushes the buffer (hands it to the send callback) and then clears it; whatever
the writing thread adds while the callback runs is cleared unsent. The callback here sleeps, as
the real one blocks on a full send queue or waits for the GIL. Instant, and it loses bytes every
time.

``--pipeline N``: a plain Beam pipeline on FnApiRunner, ``--direct_running_mode=multi_processing``
with 2 workers: two stages each make ``N/2`` values of 1 MiB, a Flatten joins them (FnApiRunner
materializes it: the consumer's input is sent to each worker as many blocks) and the values are
counted. ``--busy`` adds a thread that holds the GIL in long C calls, as large protobuf copies of
the runner's other threads do on a loaded machine: the runner's main thread then writes the blocks
slowly enough for the timer to fire in between. Measured here (2 cores): N=1600 received
860-1310 of 1600; N=400 with ``--busy``, 270-310 of 400 in 3 of 3 runs; N=400 alone, all.

    python -m benchmarks.beam_flush_race --stream
    python -m benchmarks.beam_flush_race --pipeline 400 --busy
"""

from __future__ import annotations

import argparse
import os
import threading
import time

__all__ = ["flatten_count", "stream_loss"]

MIB = 1 << 20


def stream_loss(writes: int = 100, size: int = 1000, flush_ms: int = 20) -> tuple[int, int]:
    """``(bytes written, bytes handed to the callbacks)`` of one Beam time-flushed stream."""
    from apache_beam.runners.worker.data_plane import TimeBasedBufferingClosableOutputStream

    received: list[bytes] = []

    def slow_send(data: bytes) -> None:  # the real callback blocks on the send queue
        received.append(data)
        time.sleep(0.05)

    stream = TimeBasedBufferingClosableOutputStream(close_callback=received.append, flush_callback=slow_send,
                                                    time_flush_threshold_ms=flush_ms)
    block = b"x" * size
    for _ in range(writes):
        stream.write(block)
        time.sleep(0.002)
    stream.close()
    return writes * size, sum(len(data) for data in received)


def _make(_index: int) -> bytes:
    return os.urandom(16) * (MIB // 16)


def flatten_count(values: int, busy: bool = False, workers: int = 2) -> int:
    """How many of ``values`` 1 MiB values a Flatten of two stages delivers on FnApiRunner's
    local worker processes."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    stop = threading.Event()
    if busy:
        def hold_the_gil():
            while not stop.is_set():
                sum(range(10**7))  # one C call: no thread switch inside it

        threading.Thread(target=hold_the_gil, daemon=True).start()
    counted: list[int] = []
    options = PipelineOptions(["--runner=FnApiRunner", "--direct_running_mode=multi_processing",
                               f"--direct_num_workers={workers}"])
    try:
        with beam.Pipeline(options=options) as pipeline:
            first = pipeline | "A" >> beam.Create(range(values // 2)) | "MakeA" >> beam.Map(_make)
            second = pipeline | "B" >> beam.Create(range(values // 2, values)) | "MakeB" >> beam.Map(_make)
            total = ((first, second) | beam.Flatten() | beam.Map(lambda v: ("n", len(v) // MIB))
                     | beam.CombinePerKey(sum))
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flush-race-{os.getpid()}.txt")
            _ = total | beam.Map(lambda kv, p=path: open(p, "w").write(str(kv[1])))
        with open(path) as handle:
            counted.append(int(handle.read()))
        os.remove(path)
    finally:
        stop.set()
    return counted[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream", action="store_true", help="the stream alone")
    parser.add_argument("--pipeline", type=int, metavar="N", help="a plain pipeline of N values of 1 MiB")
    parser.add_argument("--busy", action="store_true", help="with a thread that holds the GIL")
    args = parser.parse_args()
    if args.stream or not args.pipeline:
        written, sent = stream_loss()
        print(f"stream: wrote {written:,} bytes, handed {sent:,} to the send callbacks ({written - sent:,} lost)")
    if args.pipeline:
        start = time.monotonic()
        got = flatten_count(args.pipeline, args.busy)
        print(f"pipeline: received {got:,} of {args.pipeline:,} values in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
