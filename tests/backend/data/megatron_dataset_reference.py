#!/usr/bin/env python3
"""An independent reference for backend/data's GPT dataset indices and blending indices.

Written from the description of Megatron-LM's algorithms (megatron/core/datasets/gpt_dataset.py:
_get_num_epochs, the separate_final_epoch rule, _build_document_index, _build_shuffle_index;
helpers.cpp: build_sample_idx, build_blending_indices; utils.py: normalize), in plain Python over
numpy, using numpy's own RandomState for the shuffles. The C++ tests call it on the .npy files
the backend wrote; it rebuilds the arrays and compares them element for element.

Usage:
  megatron_dataset_reference.py gpt IDX BEGIN END NUM_SAMPLES|None SEQ_LENGTH SEED CACHE_BASE
      compares CACHE_BASE-{document,sample,shuffle}_index.npy
  megatron_dataset_reference.py blend WEIGHTS SIZE CACHE_BASE
      WEIGHTS comma-separated raw weights (normalized twice, as the builder and BlendedDataset
      do); compares CACHE_BASE-{dataset_index,dataset_sample_index}.npy
  megatron_dataset_reference.py normalize WEIGHTS
      prints the normalized weights, one repr() per line
Exit status 0 when equal, 1 with the first difference printed otherwise.
"""
import struct
import sys

import numpy


def read_sequence_lengths(idx_path):
    with open(idx_path, "rb") as f:
        data = f.read()
    assert data[:9] == b"MMIDIDX\x00\x00", "bad magic"
    (sequence_count,) = struct.unpack_from("<Q", data, 18)
    return numpy.frombuffer(data, dtype=numpy.int32, count=sequence_count, offset=34)


def normalize(weights):
    w = numpy.array(weights, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def document_index(documents, epochs, random_state, separate_final_epoch):
    if not separate_final_epoch or epochs == 1:
        index = numpy.tile(documents, epochs).astype(numpy.int32)
        random_state.shuffle(index)
        return index
    first = document_index(documents, epochs - 1, random_state, False)
    last = document_index(documents, 1, random_state, False)
    return numpy.concatenate((first, last))


def sample_index(lengths, doc_index, seq_length, epochs, tokens_per_epoch, dtype):
    count = (epochs * tokens_per_epoch - 1) // seq_length
    rows = numpy.zeros((count + 1, 2), dtype=dtype)
    position, offset = 0, 0
    for sample in range(1, count + 1):
        remaining = seq_length + 1
        while remaining != 0:
            length = int(lengths[doc_index[position]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                if position == len(doc_index) - 1:
                    offset = int(lengths[doc_index[position]]) - 1
                    break
                position += 1
                offset = 0
        rows[sample] = (position, offset)
    return rows


def shuffle_index(first_count, total, random_state):
    dtype = numpy.uint32 if total < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(0, first_count, dtype=dtype)
    random_state.shuffle(first)
    if first_count == total:
        return first
    last = numpy.arange(first_count, total, dtype=dtype)
    random_state.shuffle(last)
    return numpy.concatenate((first, last))


def gpt_indices(lengths, begin, end, num_samples, seq_length, seed):
    documents = numpy.arange(begin, end, dtype=numpy.int32)
    tokens_per_epoch = int(numpy.sum(lengths[documents]))
    epochs = 1
    if num_samples is not None:
        tokens = tokens_per_epoch
        while tokens < num_samples * seq_length + 1:
            epochs += 1
            tokens += tokens_per_epoch
    separate = False
    if epochs > 1:
        sans_final = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = from_final < int(0.80 * per_epoch)
    random_state = numpy.random.RandomState(seed)
    doc_index = document_index(documents, epochs, random_state, separate)
    largest = max(doc_index.shape[0], int(lengths.max()))
    dtype = numpy.int32 if largest <= numpy.iinfo(numpy.int32).max else numpy.int64
    samples = sample_index(lengths, doc_index, seq_length, epochs, tokens_per_epoch, dtype)
    total = samples.shape[0] - 1
    shuffle = shuffle_index(sans_final if separate else total, total, random_state)
    return doc_index, samples, shuffle, epochs, separate


def blending_indices(weights, size):
    dataset_index = numpy.zeros(size, dtype=numpy.int16)
    sample_index = numpy.zeros(size, dtype=numpy.int64)
    taken = [0] * len(weights)
    for step in range(size):
        x = max(float(step), 1.0)
        best, best_error = 0, weights[0] * x - float(taken[0])
        for d in range(1, len(weights)):
            error = weights[d] * x - float(taken[d])
            if error > best_error:
                best, best_error = d, error
        dataset_index[step] = best
        sample_index[step] = taken[best]
        taken[best] += 1
    return dataset_index, sample_index


def compare(name, expected, path):
    actual = numpy.load(path, mmap_mode="r")
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        print(f"{name}: {path} is {actual.dtype}{actual.shape}, expected {expected.dtype}{expected.shape}")
        return False
    differ = numpy.nonzero(numpy.asarray(actual).reshape(-1) != expected.reshape(-1))[0]
    if differ.size:
        i = differ[0]
        print(f"{name}: {differ.size} entries differ, first at {i}: "
              f"{actual.reshape(-1)[i]} != {expected.reshape(-1)[i]}")
        return False
    return True


def main(argv):
    if argv[1] == "gpt":
        idx, begin, end, num_samples, seq_length, seed, base = argv[2:9]
        num_samples = None if num_samples == "None" else int(num_samples)
        doc_index, samples, shuffle, epochs, separate = gpt_indices(
            read_sequence_lengths(idx), int(begin), int(end), num_samples, int(seq_length), int(seed))
        ok = (compare("document_index", doc_index, base + "-document_index.npy")
              & compare("sample_index", samples, base + "-sample_index.npy")
              & compare("shuffle_index", shuffle, base + "-shuffle_index.npy"))
        print(f"epochs {epochs} separate_final_epoch {separate} samples {samples.shape[0] - 1}")
        return 0 if ok else 1
    if argv[1] == "blend":
        weights = normalize(normalize([float(w) for w in argv[2].split(",")]))
        dataset_index, sample_index = blending_indices(weights, int(argv[3]))
        ok = (compare("dataset_index", dataset_index, argv[4] + "-dataset_index.npy")
              & compare("dataset_sample_index", sample_index, argv[4] + "-dataset_sample_index.npy"))
        return 0 if ok else 1
    if argv[1] == "normalize":
        for weight in normalize([float(w) for w in argv[2].split(",")]):
            print(repr(weight))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
