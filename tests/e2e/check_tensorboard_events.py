#!/usr/bin/env python3
"""Independent reader of pretrain_gpt's TensorBoard event files, run by
tests/e2e/pretrain_gpt_tensorboard_test.cpp.

It shares no code with the writer: the TFRecord framing is parsed here, both CRCs of every
record are recomputed with a bitwise CRC-32C written below (checked against RFC 3720's test
vector), and each Event is decoded by Debian's python3-protobuf from tensorboard_event.proto,
which protoc compiles into a descriptor set at test time. Then every scalar the trainer printed
(the iteration lines and the validation blocks of its log) must be in the file, under
Megatron's TensorBoard tags, equal to the printed value to the printed precision.

Exit status: 0 when all checks pass, 1 on a mismatch, 77 when python3-protobuf or protoc is
missing (the caller decides whether that is a skip or, under CI, a failure).
"""
import argparse
import collections
import glob
import math
import os
import re
import struct
import subprocess
import sys

SKIP = 77


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def load_event_class(proto: str, work: str):
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        print("python3-protobuf is not installed (apt-get install python3-protobuf)")
        sys.exit(SKIP)
    descriptor_file = os.path.join(work, "tensorboard_event.desc")
    try:
        subprocess.run(["protoc", "-I", os.path.dirname(proto), "--descriptor_set_out",
                        descriptor_file, os.path.basename(proto)], check=True)
    except FileNotFoundError:
        print("protoc is not installed (apt-get install protobuf-compiler)")
        sys.exit(SKIP)
    descriptors = descriptor_pb2.FileDescriptorSet()
    with open(descriptor_file, "rb") as f:
        descriptors.ParseFromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file_descriptor in descriptors.file:
        pool.Add(file_descriptor)
    event = pool.FindMessageTypeByName("tensorboard_subset.Event")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf ≥ 4.21
        return message_factory.GetMessageClass(event)
    return message_factory.MessageFactory(pool).GetPrototype(event)


def read_records(path: str):
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if length_crc != masked_crc32c(header):
            raise ValueError(f"{path}: length CRC mismatch at byte {offset}")
        payload = data[offset + 12:offset + 12 + length]
        footer = data[offset + 12 + length:offset + 16 + length]
        if len(payload) != length or len(footer) != 4:
            raise ValueError(f"{path}: truncated record at byte {offset}")
        if struct.unpack("<I", footer)[0] != masked_crc32c(payload):
            raise ValueError(f"{path}: data CRC mismatch at byte {offset}")
        yield payload
        offset += 16 + length


def close_to_printed(value: float, printed: str) -> bool:
    """True when the float32 `value` rounds to the printed text (its last digit ± half)."""
    expected = float(printed)
    mantissa = printed.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(printed.lower().split("e")[1]) if "e" in printed.lower() else 0
    half_unit = 0.5 * 10.0 ** (exponent - decimals)
    return abs(value - expected) <= half_unit * 1.0001 + abs(expected) * 2.0 ** -23


ITERATION = re.compile(
    r" iteration +(\d+)/ *\d+ \| consumed samples: +(\d+) \|.*?"
    r"(?: throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+) \|)?"
    r" learning rate: ([0-9.E+-]+) \| global batch size: +(\d+) \| lm loss: ([0-9.E+-]+) \|"
    r" loss scale: ([0-9.]+) \| grad norm: ([0-9.]+) \|")
VALIDATION = re.compile(
    r" validation loss at iteration (\d+)(?: on (?:validation|test) set)? \| "
    r"lm loss value: ([0-9.E+-]+) \| lm loss PPL: ([0-9.E+-]+) \|")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", required=True, help="the --tensorboard-dir")
    parser.add_argument("--log", required=True, help="pretrain_gpt's captured output")
    parser.add_argument("--proto", required=True)
    parser.add_argument("--work", required=True, help="a scratch directory")
    parser.add_argument("--expect-ppl", action="store_true")
    parser.add_argument("--expect-throughput", action="store_true")
    parser.add_argument("--no-loss-scale", action="store_true",
                        help="the run had --no-log-loss-scale-to-tensorboard")
    options = parser.parse_args()

    assert crc32c(b"123456789") == 0xE3069283, "CRC-32C self-test (RFC 3720) failed"
    event_class = load_event_class(os.path.abspath(options.proto), options.work)

    files = glob.glob(os.path.join(options.events, "events.out.tfevents.*"))
    if len(files) != 1:
        print(f"expected one event file in {options.events}, found {files}")
        return 1
    name = os.path.basename(files[0])
    if not re.fullmatch(r"events\.out\.tfevents\.\d{10}\.[^.]+(\.[^.]+)*\.\d+\.\d+", name):
        print(f"event file name {name} is not events.out.tfevents.<seconds>.<host>.<pid>.<n>")
        return 1

    scalars = collections.defaultdict(lambda: collections.defaultdict(list))
    events = [event_class.FromString(record) for record in read_records(files[0])]
    if not events or events[0].file_version != "brain.Event:2":
        print("the first event is not file_version brain.Event:2")
        return 1
    for event in events[1:]:
        if not event.HasField("summary") or event.wall_time <= 0:
            print(f"unexpected event {event}")
            return 1
        for value in event.summary.value:
            scalars[value.tag][event.step].append(value.simple_value)

    failures = []

    def check(tag: str, step: int, printed: str):
        values = scalars.get(tag, {}).get(step, [])
        if not any(close_to_printed(v, printed) for v in values):
            failures.append(f"{tag} at step {step}: printed {printed}, event file has {values}")

    with open(options.log, encoding="utf-8") as f:
        log = f.read()
    iterations = ITERATION.findall(log)
    validations = VALIDATION.findall(log)
    if not iterations or not validations:
        print("the log has no iteration lines or no validation blocks to compare with")
        return 1
    for (iteration, consumed, throughput, lr, batch, loss, loss_scale, grad_norm) in iterations:
        step, samples = int(iteration), int(consumed)
        expected = [("learning-rate", lr), ("batch-size", batch), ("lm loss", loss),
                    ("grad-norm", grad_norm)]
        if not options.no_loss_scale:
            expected.append(("loss-scale", loss_scale))
        for tag, printed in expected:
            check(tag, step, printed)
            check(tag + " vs samples", samples, printed)
        if options.expect_throughput:
            if not throughput:
                failures.append(f"iteration {step}: no throughput field in the log line")
            else:
                check("throughput", step, throughput)
    for (iteration, loss, ppl) in validations:
        check("lm loss validation", int(iteration), loss)
        if options.expect_ppl:
            check("lm loss validation ppl", int(iteration), ppl)
    if options.no_loss_scale and "loss-scale" in scalars:
        failures.append("loss-scale written despite --no-log-loss-scale-to-tensorboard")
    for tag in scalars:
        if not math.isfinite(min(v for values in scalars[tag].values() for v in values)):
            failures.append(f"{tag} has a non-finite value")

    if failures:
        print("\n".join(failures))
        return 1
    print(f"{name}: {len(events)} events, CRCs good; {len(iterations)} iteration lines and "
          f"{len(validations)} validation blocks match tags {sorted(scalars)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
