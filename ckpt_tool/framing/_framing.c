/* The sequential loops of the record path, in C (see README, "Performance").
 *
 * frame(data) walks the chain of 4-byte big-endian length prefixes of Flink's record
 * serializer: each record's position depends on the previous record's length, so the walk
 * cannot be vectorised. payloads(file, offsets) does the same for a channel handle's network
 * buffers, and gather(data, starts, ends) concatenates byte ranges. string_tails checks string
 * values (a varint per UTF-16 unit: counted eight bytes at a time) and key_groups computes Flink's
 * murmur key groups of hash codes, one loop each instead of a dozen NumPy passes. Everything else
 * on the record path (tags, keys, routing) is vectorised with NumPy. int_rows writes rows of
 * integers between literal text (`inspect --json`'s millions of channel rows) in one pass, and
 * digests the xxh3-128 digest of each of many byte ranges (a rescale's proof digests every new
 * channel: millions at p=4,096) with xxHash itself (xxhash.h, vendored from xxHash 0.8.3, BSD-2).
 * span_runs and payloads_in_runs read a file's buffers from the runs a task read of it (a task at
 * p=4,096 visits each of 4,096 files for about a hundred buffers: two calls, not thirty NumPy ones).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include "xxhash.h"

static int32_t read_length(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

/* frame(data) -> (starts, end): the offsets of every whole record's length field, as native
 * int64 bytes, and where the first incomplete record (the trailing bytes) begins. */
static PyObject *frame(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    const unsigned char *bytes = data.buf;
    Py_ssize_t size = data.len, pos = 0, count = 0;
    while (pos + 4 <= size) {
        int32_t length = read_length(bytes + pos);
        if (length < 0) {
            PyBuffer_Release(&data);
            return PyErr_Format(PyExc_ValueError, "negative record length %d at byte %zd of a channel", length, pos);
        }
        if (pos + 4 + (Py_ssize_t)length > size) break;
        pos += 4 + (Py_ssize_t)length;
        count++;
    }
    PyObject *starts = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (starts == NULL) {
        PyBuffer_Release(&data);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(starts);
    Py_ssize_t end = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = end;
        end += 4 + (Py_ssize_t)read_length(bytes + end);
    }
    PyBuffer_Release(&data);
    return Py_BuildValue("(Nn)", starts, end);
}

/* frame_segments(data, bounds) -> (starts, ends): frame() of each segment data[bounds[i]:bounds[i+1]]
 * (bounds: n+1 ascending int64s inside data), in one pass: the offsets (in data) of every whole
 * record's length field of every segment, as native int64 bytes, and per segment where its first
 * incomplete record begins (n int64s). Several channels read together are framed channel by channel. */
static PyObject *frame_segments(PyObject *self, PyObject *args) {
    Py_buffer data, bounds;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &bounds)) return NULL;
    PyObject *starts = NULL, *ends = NULL, *result = NULL;
    const unsigned char *bytes = data.buf;
    const int64_t *at = bounds.buf;
    Py_ssize_t segments = bounds.len / (Py_ssize_t)sizeof(int64_t) - 1, count = 0;
    if (segments < 0) segments = 0;
    for (Py_ssize_t s = 0; s <= segments && segments > 0; s++) {
        if (at[s] < 0 || at[s] > data.len || (s > 0 && at[s] < at[s - 1])) {
            PyErr_SetString(PyExc_ValueError, "segment bounds outside the data");
            goto done;
        }
    }
    for (Py_ssize_t s = 0; s < segments; s++) {
        Py_ssize_t pos = at[s], size = at[s + 1];
        while (pos + 4 <= size) {
            int32_t length = read_length(bytes + pos);
            if (length < 0) {
                PyErr_Format(PyExc_ValueError, "negative record length %d at byte %zd of a channel", length, pos - at[s]);
                goto done;
            }
            if (pos + 4 + (Py_ssize_t)length > size) break;
            pos += 4 + (Py_ssize_t)length;
            count++;
        }
    }
    starts = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    ends = PyBytes_FromStringAndSize(NULL, segments * (Py_ssize_t)sizeof(int64_t));
    if (starts == NULL || ends == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(starts), *end_out = (int64_t *)PyBytes_AS_STRING(ends);
    for (Py_ssize_t s = 0; s < segments; s++) {
        Py_ssize_t pos = at[s], size = at[s + 1];
        while (pos + 4 <= size) {
            Py_ssize_t next = pos + 4 + (Py_ssize_t)read_length(bytes + pos);
            if (next > size) break;
            *out++ = pos;
            pos = next;
        }
        end_out[s] = pos;
    }
    result = Py_BuildValue("(OO)", starts, ends);
done:
    Py_XDECREF(starts);
    Py_XDECREF(ends);
    PyBuffer_Release(&data);
    PyBuffer_Release(&bounds);
    return result;
}

/* Whether starts and ends (int64 buffers) are of one length and each range lies inside data;
 * else a ValueError is set. */
static int ranges_inside(const Py_buffer *data, const Py_buffer *starts, const Py_buffer *ends) {
    const int64_t *first = starts->buf, *last = ends->buf;
    if (ends->len != starts->len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        return 0;
    }
    for (Py_ssize_t i = 0; i < starts->len / (Py_ssize_t)sizeof(int64_t); i++) {
        if (first[i] < 0 || last[i] < first[i] || last[i] > data->len) {
            PyErr_SetString(PyExc_ValueError, "range outside the data");
            return 0;
        }
    }
    return 1;
}

/* gather(data, starts, ends) -> bytes: data[starts[i]:ends[i]] for every i, concatenated;
 * starts and ends are int64 buffers of equal length, each range inside data. */
static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer data, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &starts, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = starts.len / (Py_ssize_t)sizeof(int64_t), total = 0;
    const int64_t *first = starts.buf, *last = ends.buf;
    if (!ranges_inside(&data, &starts, &ends)) goto done;
    for (Py_ssize_t i = 0; i < count; i++) total += last[i] - first[i];
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    char *out = PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(out, (const char *)data.buf + first[i], (size_t)(last[i] - first[i]));
        out += last[i] - first[i];
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

/* digests(data, starts, ends) -> bytes: the xxh3-128 digest of each data[starts[i]:ends[i]], in
 * canonical (big-endian) form as Python's xxhash.xxh3_128(...).digest() gives it, 16 bytes each,
 * one after another. starts and ends are int64 buffers of equal length, each range inside data. */
static PyObject *digests(PyObject *self, PyObject *args) {
    Py_buffer data, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &starts, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = starts.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *first = starts.buf, *last = ends.buf;
    if (!ranges_inside(&data, &starts, &ends)) goto done;
    result = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(XXH128_canonical_t));
    if (result == NULL) goto done;
    XXH128_canonical_t *out = (XXH128_canonical_t *)PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        XXH128_canonicalFromHash(&out[i], XXH3_128bits((const char *)data.buf + first[i], (size_t)(last[i] - first[i])));
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

/* Bytes below 0x80 in p[0:n]: eight at a time (each byte's top bit, summed by a multiply). */
static int64_t low_bytes(const unsigned char *p, int64_t n) {
    int64_t high = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        memcpy(&word, p + i, 8);
        high += (int64_t)((((word >> 7) & 0x0101010101010101ULL) * 0x0101010101010101ULL) >> 56);  /* no popcnt needed */
    }
    for (; i < n; i++) high += p[i] >> 7;
    return n - high;
}

/* string_tails(data, tails, ends) -> bytes: for each i, 1 where data[tails[i]:ends[i]] is exactly
 * one Flink StringValue (a varint of its length + 1, at most 5 bytes, 0 for null, then one varint
 * per UTF-16 unit: a null value is empty, and the varints end at ends[i]), else 0. tails and ends
 * are int64 buffers of equal length, each range inside data. */
static PyObject *string_tails(PyObject *self, PyObject *args) {
    Py_buffer data, tails, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &tails, &ends)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = tails.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *first = tails.buf, *last = ends.buf;
    const unsigned char *bytes = data.buf;
    if (ends.len != tails.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (first[i] < 0 || last[i] < 0 || last[i] > data.len) {
            PyErr_SetString(PyExc_ValueError, "range outside the data");
            goto done;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, count);
    if (result == NULL) goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t at = first[i], end = last[i];
        uint64_t length = 0;
        int more = 1, size = 0;
        while (more && size < 5 && at + size < end) {
            unsigned char b = bytes[at + size];
            length |= (uint64_t)(b & 0x7F) << (7 * size);
            more = b >= 0x80;
            size++;
        }
        int fits = size > 0 && !more;
        if (fits) {
            int64_t chars = at + size;
            if (length == 0) {
                fits = chars == end;
            } else {
                fits = (chars == end || bytes[end - 1] < 0x80) && (uint64_t)low_bytes(bytes + chars, end - chars) == length - 1;
            }
        }
        out[i] = (unsigned char)fits;
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&tails);
    PyBuffer_Release(&ends);
    return result;
}

/* key_groups(hashes, max_parallelism) -> bytes: Flink's KeyGroupRangeAssignment.computeKeyGroupForKeyHash
 * (MathUtils.murmurHash of the hash code, modulo the max parallelism) of each native uint32 hash
 * code, as native int32s. */
static PyObject *key_groups(PyObject *self, PyObject *args) {
    Py_buffer hashes;
    long long max_parallelism;
    if (!PyArg_ParseTuple(args, "y*L", &hashes, &max_parallelism)) return NULL;
    if (max_parallelism <= 0 || max_parallelism > INT32_MAX) {
        PyBuffer_Release(&hashes);
        return PyErr_Format(PyExc_ValueError, "max parallelism %lld out of range", max_parallelism);
    }
    Py_ssize_t count = hashes.len / (Py_ssize_t)sizeof(uint32_t);
    PyObject *result = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int32_t));
    if (result != NULL) {
        const uint32_t *in = hashes.buf;
        int32_t *out = (int32_t *)PyBytes_AS_STRING(result);
        uint32_t modulus = (uint32_t)max_parallelism;
        for (Py_ssize_t i = 0; i < count; i++) {
            uint32_t code = in[i] * 0xCC9E2D51u;
            code = (code << 15) | (code >> 17);
            code *= 0x1B873593u;
            code = (code << 13) | (code >> 19);
            code = code * 5u + 0xE6546B64u;
            code ^= 4u;
            code ^= code >> 16;
            code *= 0x85EBCA6Bu;
            code ^= code >> 13;
            code *= 0xC2B2AE35u;
            code ^= code >> 16;
            int32_t signed_code = (int32_t)code;
            uint32_t positive = signed_code >= 0 ? (uint32_t)signed_code : signed_code == INT32_MIN ? 0u : (uint32_t)(-signed_code);
            out[i] = (int32_t)(positive % modulus);
        }
    }
    PyBuffer_Release(&hashes);
    return result;
}

/* Check the buffers whose int length fields are at the int64 offsets: each inside the data and
 * starting after the end of the one before it (offsets come in the order written). Sets the total
 * payload length; on error sets a ValueError naming the first bad buffer and returns -1. */
static int check_buffers(const Py_buffer *data, const int64_t *at, Py_ssize_t count, Py_ssize_t *total) {
    const unsigned char *bytes = data->buf;
    int64_t previous_end = 0;
    *total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (at[i] < 0 || at[i] + 4 > data->len) {
            PyErr_Format(PyExc_ValueError, "buffer offset %lld is outside the file (%zd bytes)", (long long)at[i], data->len);
            return -1;
        }
        if (at[i] < previous_end) {
            PyErr_Format(PyExc_ValueError, "buffer offset %lld repeats or overlaps the buffer before it (which ends at %lld)",
                         (long long)at[i], (long long)previous_end);
            return -1;
        }
        int32_t length = read_length(bytes + at[i]);
        if (length < 0 || at[i] + 4 + (int64_t)length > data->len) {
            PyErr_Format(PyExc_ValueError, "buffer at offset %lld of length %d runs past the end (%zd bytes)",
                         (long long)at[i], length, data->len);
            return -1;
        }
        previous_end = at[i] + 4 + (int64_t)length;
        *total += length;
    }
    return 0;
}

/* payloads(data, offsets) -> bytes: the payloads of the checked buffers, concatenated. */
static PyObject *payloads(PyObject *self, PyObject *args) {
    Py_buffer data, offsets;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &offsets)) return NULL;
    PyObject *result = NULL;
    const int64_t *at = offsets.buf;
    Py_ssize_t count = offsets.len / (Py_ssize_t)sizeof(int64_t), total;
    if (check_buffers(&data, at, count, &total) == 0) {
        result = PyBytes_FromStringAndSize(NULL, total);
        if (result != NULL) {
            char *out = PyBytes_AS_STRING(result);
            for (Py_ssize_t i = 0; i < count; i++) {
                int32_t length = read_length((const unsigned char *)data.buf + at[i]);
                memcpy(out, (const char *)data.buf + at[i] + 4, (size_t)length);
                out += length;
            }
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return result;
}

/* payloads_many(data, offsets, counts) -> (payloads, sizes): payloads() of several handles of one
 * file at once: handle h has the next counts[h] offsets, each handle's buffers checked on their own;
 * their payloads concatenated in handle order, and each handle's payload bytes (int64s). */
static PyObject *payloads_many(PyObject *self, PyObject *args) {
    Py_buffer data, offsets, counts;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &offsets, &counts)) return NULL;
    PyObject *result = NULL, *out = NULL, *sizes = NULL;
    const int64_t *at = offsets.buf, *many = counts.buf;
    Py_ssize_t handles = counts.len / (Py_ssize_t)sizeof(int64_t), total = 0, used = 0;
    Py_ssize_t buffers = offsets.len / (Py_ssize_t)sizeof(int64_t);
    sizes = PyBytes_FromStringAndSize(NULL, handles * (Py_ssize_t)sizeof(int64_t));
    if (sizes == NULL) goto done;
    int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes);
    for (Py_ssize_t h = 0; h < handles; h++) {
        Py_ssize_t mine;
        if (many[h] < 0 || used + many[h] > buffers) {
            PyErr_SetString(PyExc_ValueError, "buffer counts do not match the offsets");
            goto done;
        }
        if (check_buffers(&data, at + used, many[h], &mine) != 0) goto done;
        size_out[h] = mine;
        total += mine;
        used += many[h];
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    char *write = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < used; i++) {
        int32_t length = read_length((const unsigned char *)data.buf + at[i]);
        memcpy(write, (const char *)data.buf + at[i] + 4, (size_t)length);
        write += length;
    }
    result = Py_BuildValue("(OO)", out, sizes);
done:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&counts);
    return result;
}

static int compare_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* span_runs(offsets, gap) -> [(first, last), ...]: the int64 offsets sorted, in runs cut where the
 * next lies more than gap on; each run's first and last offset (a file's buffers that a task reads
 * in few reads: at p=4,096 a task visits each of 4,096 files, so this is one call, not a dozen NumPy
 * passes). */
static PyObject *span_runs(PyObject *self, PyObject *args) {
    Py_buffer offsets;
    long long gap;
    if (!PyArg_ParseTuple(args, "y*L", &offsets, &gap)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t count = offsets.len / (Py_ssize_t)sizeof(int64_t);
    int64_t *sorted = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(int64_t));
    if (sorted == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(sorted, offsets.buf, (size_t)count * sizeof(int64_t));
    qsort(sorted, (size_t)count, sizeof(int64_t), compare_int64);
    result = PyList_New(0);
    for (Py_ssize_t i = 0; result != NULL && i < count;) {
        Py_ssize_t j = i;
        while (j + 1 < count && sorted[j + 1] - sorted[j] <= gap) j++;
        PyObject *run = Py_BuildValue("(LL)", (long long)sorted[i], (long long)sorted[j]);
        if (run == NULL || PyList_Append(result, run) != 0) Py_CLEAR(result);
        Py_XDECREF(run);
        i = j + 1;
    }
    PyMem_Free(sorted);
done:
    PyBuffer_Release(&offsets);
    return result;
}

/* payloads_in_runs(runs, firsts, offsets, counts) -> (payloads, sizes): payloads_many() of a file
 * read in runs, without joining them: runs[r] holds the file's bytes from offset firsts[r] (int64s,
 * ascending, the runs apart). Each buffer (at a file offset) must lie whole inside one run; handle h
 * has the next counts[h] offsets, each handle's buffers in the order written. */
static PyObject *payloads_in_runs(PyObject *self, PyObject *args) {
    PyObject *runs_arg;
    Py_buffer firsts_buf, offsets, counts;
    if (!PyArg_ParseTuple(args, "Oy*y*y*", &runs_arg, &firsts_buf, &offsets, &counts)) return NULL;
    PyObject *result = NULL, *out = NULL, *sizes = NULL, *runs = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t held = 0;
    const int64_t *firsts = firsts_buf.buf, *at = offsets.buf, *many = counts.buf;
    Py_ssize_t run_count = firsts_buf.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t handles = counts.len / (Py_ssize_t)sizeof(int64_t), buffers = offsets.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t total = 0, used = 0;
    int32_t *found_length = NULL;
    Py_ssize_t *found_run = NULL;
    runs = PySequence_Fast(runs_arg, "runs must be a sequence of bytes");
    if (runs == NULL) goto done;
    if (PySequence_Fast_GET_SIZE(runs) != run_count) {
        PyErr_SetString(PyExc_ValueError, "the runs and their offsets do not match");
        goto done;
    }
    views = PyMem_Calloc((size_t)(run_count ? run_count : 1), sizeof(Py_buffer));
    found_length = PyMem_Malloc((size_t)(buffers ? buffers : 1) * sizeof(int32_t));
    found_run = PyMem_Malloc((size_t)(buffers ? buffers : 1) * sizeof(Py_ssize_t));
    if (views == NULL || found_length == NULL || found_run == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    while (held < run_count) {  /* held: the views taken so far, each released at the end */
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(runs, held), &views[held], PyBUF_SIMPLE) != 0) goto done;
        held++;
        if (held > 1 && firsts[held - 1] < firsts[held - 2] + (int64_t)views[held - 2].len) {
            PyErr_SetString(PyExc_ValueError, "the runs overlap or are out of order");
            goto done;
        }
    }
    sizes = PyBytes_FromStringAndSize(NULL, handles * (Py_ssize_t)sizeof(int64_t));
    if (sizes == NULL) goto done;
    int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes);
    for (Py_ssize_t h = 0; h < handles; h++) {
        if (many[h] < 0 || used + many[h] > buffers) {
            PyErr_SetString(PyExc_ValueError, "buffer counts do not match the offsets");
            goto done;
        }
        int64_t previous_end = 0, mine = 0;
        for (Py_ssize_t i = used; i < used + many[h]; i++) {
            Py_ssize_t low = 0, high = run_count;  /* the last run starting at or before the offset */
            while (low < high) {
                Py_ssize_t middle = (low + high) / 2;
                if (firsts[middle] <= at[i]) low = middle + 1;
                else high = middle;
            }
            Py_ssize_t r = low - 1;
            if (r < 0 || at[i] + 4 > firsts[r] + (int64_t)views[r].len) {
                PyErr_Format(PyExc_ValueError, "buffer offset %lld is outside the runs read", (long long)at[i]);
                goto done;
            }
            if (at[i] < previous_end) {
                PyErr_Format(PyExc_ValueError, "buffer offset %lld repeats or overlaps the buffer before it (which ends at %lld)",
                             (long long)at[i], (long long)previous_end);
                goto done;
            }
            int32_t length = read_length((const unsigned char *)views[r].buf + (at[i] - firsts[r]));
            if (length < 0 || at[i] + 4 + (int64_t)length > firsts[r] + (int64_t)views[r].len) {
                PyErr_Format(PyExc_ValueError, "buffer at offset %lld of length %d runs past its run (which ends at %lld)",
                             (long long)at[i], length, (long long)(firsts[r] + (int64_t)views[r].len));
                goto done;
            }
            previous_end = at[i] + 4 + (int64_t)length;
            found_length[i] = length;
            found_run[i] = r;
            mine += length;
        }
        size_out[h] = mine;
        total += (Py_ssize_t)mine;
        used += many[h];
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    char *write = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < used; i++) {
        Py_ssize_t r = found_run[i];
        memcpy(write, (const char *)views[r].buf + (at[i] - firsts[r]) + 4, (size_t)found_length[i]);
        write += found_length[i];
    }
    result = Py_BuildValue("(OO)", out, sizes);
done:
    for (Py_ssize_t r = 0; r < held; r++) PyBuffer_Release(&views[r]);
    PyMem_Free(views);
    PyMem_Free(found_length);
    PyMem_Free(found_run);
    Py_XDECREF(runs);
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    PyBuffer_Release(&firsts_buf);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&counts);
    return result;
}

/* lengths(data, offsets) -> bytes: the checked buffers' payload lengths as native int64s, copying
 * no payload (to look at buffers where they lie). */
static PyObject *lengths(PyObject *self, PyObject *args) {
    Py_buffer data, offsets;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &offsets)) return NULL;
    PyObject *result = NULL;
    const int64_t *at = offsets.buf;
    Py_ssize_t count = offsets.len / (Py_ssize_t)sizeof(int64_t), total;
    if (check_buffers(&data, at, count, &total) == 0) {
        result = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
        if (result != NULL) {
            int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
            for (Py_ssize_t i = 0; i < count; i++) out[i] = read_length((const unsigned char *)data.buf + at[i]);
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return result;
}

/* Decimal digits of v (a '-' included). */
static Py_ssize_t decimal_width(int64_t v) {
    uint64_t m = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    Py_ssize_t width = v < 0 ? 2 : 1;
    while (m >= 10) {
        m /= 10;
        width++;
    }
    return width;
}

/* int_rows(parts, values, separator) -> bytes: a row per k int64s of values (k = len(parts) - 1,
 * row after row): parts[0], the row's first value in decimal, parts[1], ..., parts[k]; the rows
 * joined by separator. What separator.join(b"%d".join(parts) % row for row in rows) gives: the
 * JSON of millions of channel rows, made in one pass. */
static PyObject *int_rows(PyObject *self, PyObject *args) {
    PyObject *parts;
    Py_buffer values, separator;
    if (!PyArg_ParseTuple(args, "O!y*y*", &PyTuple_Type, &parts, &values, &separator)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(parts) - 1, fixed = 0;
    const int64_t *v = values.buf;
    Py_ssize_t count = values.len / (Py_ssize_t)sizeof(int64_t);
    if (k < 1 || values.len % (Py_ssize_t)sizeof(int64_t) || count % k) {
        PyErr_SetString(PyExc_ValueError, "values are not rows of len(parts) - 1 int64s");
        goto done;
    }
    for (Py_ssize_t j = 0; j <= k; j++) {
        PyObject *part = PyTuple_GET_ITEM(parts, j);
        if (!PyBytes_Check(part)) {
            PyErr_SetString(PyExc_TypeError, "parts must be bytes");
            goto done;
        }
        fixed += PyBytes_GET_SIZE(part);
    }
    Py_ssize_t rows = count / k, total = rows ? fixed * rows + separator.len * (rows - 1) : 0;
    for (Py_ssize_t i = 0; i < count; i++) total += decimal_width(v[i]);
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    char *out = PyBytes_AS_STRING(result), digits[24];
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (r) {
            memcpy(out, separator.buf, (size_t)separator.len);
            out += separator.len;
        }
        for (Py_ssize_t j = 0; j <= k; j++) {
            PyObject *part = PyTuple_GET_ITEM(parts, j);
            memcpy(out, PyBytes_AS_STRING(part), (size_t)PyBytes_GET_SIZE(part));
            out += PyBytes_GET_SIZE(part);
            if (j == k) break;
            int64_t x = v[r * k + j];
            uint64_t m = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
            int n = 0;
            do {
                digits[n++] = (char)('0' + m % 10);
                m /= 10;
            } while (m);
            if (x < 0) *out++ = '-';
            while (n) *out++ = digits[--n];
        }
    }
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&separator);
    return result;
}

static PyMethodDef methods[] = {
    {"payloads", payloads, METH_VARARGS, "The payloads of the buffers at the offsets, concatenated."},
    {"payloads_many", payloads_many, METH_VARARGS, "payloads() of several handles of one file: their payloads and sizes."},
    {"span_runs", span_runs, METH_VARARGS, "The offsets sorted, in runs cut where the next lies more than gap on: [(first, last), ...]."},
    {"payloads_in_runs", payloads_in_runs, METH_VARARGS, "payloads_many() of a file read in runs, each buffer inside one run."},
    {"lengths", lengths, METH_VARARGS, "The payload lengths of the buffers at the offsets (int64s)."},
    {"frame", frame, METH_VARARGS, "Offsets of the length fields of every whole record, and the end of the last."},
    {"frame_segments", frame_segments, METH_VARARGS, "frame() of each segment between the bounds, in one pass."},
    {"gather", gather, METH_VARARGS, "Concatenate data[starts[i]:ends[i]]."},
    {"digests", digests, METH_VARARGS, "The xxh3-128 digest (canonical, 16 bytes) of each data[starts[i]:ends[i]], joined."},
    {"key_groups", key_groups, METH_VARARGS, "Key groups of uint32 hash codes (Flink's murmur hash), as int32s."},
    {"string_tails", string_tails, METH_VARARGS, "Whether each data[tails[i]:ends[i]] is exactly one StringValue (0/1 bytes)."},
    {"int_rows", int_rows, METH_VARARGS, "Rows of int64s between literal parts, in decimal, joined by a separator."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_framing", NULL, -1, methods};

PyMODINIT_FUNC PyInit__framing(void) { return PyModule_Create(&module); }
