"""Each file's records counted while they are read, against what schema.json promises.

TensorFlow's TFRecord reader can end a file early without an error: a GZIP or
ZLIB file cut off between two deflate blocks, or a plain file cut exactly at
a record boundary (no CRC is broken), simply reads short. And where it does
fail ("corrupted record at 297", "truncated record at 7248"), its error names
no file, and it is raised deep inside `model.fit`'s step function, where no
Python code of kerasfast runs to catch and re-word it.

So the check lives inside the `tf.data` pipeline: each file is read as blocks
of records with a running tally (records and bytes of the decompressed stream)
carried by `scan`, and one empty block appended after the file's last record
compares the tally with the count schema.json promises. A read error ends the
file (`ignore_errors`, which TensorFlow's reader answers by moving past the
file) and so shows as a short count: the error raised then names the file,
the first record not read, its byte offset, the count read and the count
promised, wherever the dataset is iterated: a user's loop, `model.fit`,
`kerasfast.fit`, a tf.data service worker. The tally costs one small function
call per block of records, not per record.

What the pipeline cannot know is *why* the record could not be read; the
message points to `kerasfast.data.check_tfrecords`, and `explain_data_error`
(which `kerasfast.fit` calls) re-reads the file in Python to say it.
"""

from __future__ import annotations

import re
import sys

# Bytes of TFRecord framing around each record's data: length, its CRC, data CRC.
FRAMING_BYTES = 16
# Marks the in-pipeline error text, so that `short_file_in_error` can find it again.
SHORT_FILE_MARK = "kerasfast.data: record count check:"
_SHORT_FILE_RE = re.compile(re.escape(SHORT_FILE_MARK) + r" (.+?) read (\d+) of (\d+) records")


def counted_blocks(records, path, promised, block: int, on_short: str = "raise"):
    """Blocks of one file's records, checked against the count the file promises.

    Args:
        records: the file's records, a `tf.data.Dataset` of scalar strings
            (TensorFlow read errors already turned into its end).
        path: the file's path (a string tensor inside `interleave`).
        promised: records the file must hold (int64 tensor); the check fails
            as soon as more are read, and at the end if fewer were.
        block: records per block (the last block of the file may be shorter).
        on_short: "raise" (an `InvalidArgumentError` whose text names the
            file, the record and byte offset where reading stopped, and the
            counts) or "skip" (the same text printed as a warning on stderr).

    Returns:
        A dataset of 1-D string tensors: the file's records in blocks of
        `block`, then one empty block (harmless to `rebatch`/`unbatch`).

    Example:

    >>> import tensorflow as tf
    >>> records = tf.data.Dataset.from_tensor_slices(["a", "b", "c"])
    >>> blocks = counted_blocks(records, tf.constant("f.tfrecord"), tf.constant(3, tf.int64), 2)
    >>> [b.tolist() for b in blocks.as_numpy_iterator()]
    [[b'a', b'b'], [b'c'], []]
    """
    import tensorflow as tf

    end = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))

    def tally(state, records_block):
        count, offset = state
        n = tf.size(records_block, out_type=tf.int64)
        at_end = tf.equal(n, 0)
        ok = tf.where(at_end, tf.equal(count, promised), count + n <= promised)
        tf.cond(ok, tf.no_op, lambda: _report(path, (count, n, promised), offset, at_end, on_short))
        size = tf.reduce_sum(tf.strings.length(records_block))
        return (count + n, offset + FRAMING_BYTES * n + tf.cast(size, tf.int64)), records_block

    zero = tf.constant(0, tf.int64)
    return records.batch(block).concatenate(end).scan((zero, zero), tally)


def _report(path, counts, offset, at_end, on_short: str):
    """The op that raises (or prints) the short/long-file message; runs only when the count is wrong.

    `counts` is `(records before this block, records in it, records promised)`.
    """
    import tensorflow as tf

    count, n, promised = counts
    # Assert prints strings C-escaped: the text holds no quotes, and the path is joined in, not formatted.
    file, read, offset = path, tf.strings.as_string(count), tf.strings.as_string(offset)
    short = tf.strings.join([
        SHORT_FILE_MARK, " ", file, " read ", read, " of ", tf.strings.as_string(promised), " records: record ",
        read, " (byte offset ", offset, ") and those after it could not be read: the record is damaged, or the "
        "file was truncated, replaced or deleted after writing. kerasfast.data.check_tfrecords(", file, ") says "
        "what is wrong; re-copy or re-write the file, or read it with on_error=skip to train on the readable "
        "records."])
    long = tf.strings.join([
        SHORT_FILE_MARK, " ", file, " read ", tf.strings.as_string(count + n), " of ", tf.strings.as_string(promised),
        " records: it holds more records than schema.json promises, so it was replaced after writing; re-run the "
        "conversion (kerasfast.data.check_tfrecords(", file, ") lists it)."])
    message = tf.where(at_end, short, long)
    if on_short == "skip":
        tf.print("WARNING: on_error='skip':", message, output_stream=sys.stderr)
        return tf.no_op()
    return tf.debugging.Assert(False, [message])


def short_file_in_error(error: BaseException) -> tuple | None:
    """`(file, read, promised)` when `error` is the in-pipeline count check failing, else None.

    Example:

    >>> short_file_in_error(ValueError("kerasfast.data: record count check: d/a.tfrecord read 18 of 50 records: ..."))
    ('d/a.tfrecord', 18, 50)
    """
    found = _SHORT_FILE_RE.search(str(error))
    if found is None:
        return None
    return found.group(1), int(found.group(2)), int(found.group(3))
