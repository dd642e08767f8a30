# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The leaf link's per-message work compiled: ``gateway.wire.framing`` (its reference, in Python)
with the byte scanning and formatting in C. Same inputs, same frames and bytes; what is rare
(control frames, unusual message lines, ``headers_only`` and pinned deliveries) is handed to the
Python code, so there is one definition of it."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.string cimport memcmp, memcpy

from gateway.wire import framing as _py
from gateway.wire.frames import AckRun, Msg, ProtocolError, control_frame, reply_of

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline bint _is_digit(char c) noexcept nogil:
    return b"0" <= c <= b"9"


cdef inline bint _is_name(char c) noexcept nogil:
    """A byte of a stream or consumer name in an ack subject (``[^. \\r\\n]``)."""
    return c != b"." and c != b" " and c != b"\r" and c != b"\n"


cdef inline bint _is_space(char c) noexcept nogil:
    """ASCII whitespace as ``bytes.split`` sees it."""
    return c == b" " or c == b"\t" or c == b"\n" or c == b"\r" or c == b"\x0b" or c == b"\x0c"


cdef Py_ssize_t _find_crlf(const char* p, Py_ssize_t pos, Py_ssize_t n) noexcept nogil:
    while pos + 1 < n:
        if p[pos] == b"\r" and p[pos + 1] == b"\n":
            return pos
        pos += 1
    return -1


cdef Py_ssize_t _plain_ack(const char* p, Py_ssize_t pos, Py_ssize_t n, Py_ssize_t* f) noexcept nogil:
    """The end of the plain ack at ``pos`` (``LMSG $JS.ACK.<s>.<c>.<5 numbers> `` and body
    ``+ACK`` or none), or -1. ``f`` gets the bounds of subject, stream, consumer and sequence."""
    cdef Py_ssize_t i = pos + 13, k
    if n - pos < 13 or memcmp(p + pos, b"LMSG $JS.ACK.", 13) != 0:
        return -1
    f[0] = pos + 5
    for k in range(2):  # stream, consumer
        f[2 + 2 * k] = i
        while i < n and _is_name(p[i]):
            i += 1
        if i == f[2 + 2 * k] or i >= n or p[i] != b".":
            return -1
        f[3 + 2 * k] = i
        i += 1
    for k in range(5):  # deliveries, stream seq, consumer seq, time, pending
        if k == 1:
            f[6] = i
        while i < n and _is_digit(p[i]):
            i += 1
        if k == 1:
            f[7] = i
        if i >= n or (k == 1 and i == f[6]):
            return -1
        if k < 4:
            if p[i] != b"." or not _is_digit(p[i - 1]):
                return -1
        elif p[i] != b" " or not _is_digit(p[i - 1]):
            return -1
        i += 1
    f[1] = i - 1
    if n - i >= 9 and memcmp(p + i, b"4\r\n+ACK\r\n", 9) == 0:
        return i + 9
    if n - i >= 5 and memcmp(p + i, b"0\r\n\r\n", 5) == 0:
        return i + 5
    return -1


cdef inline bint _same(bytes known, const char* p, Py_ssize_t k):
    """Whether ``known`` holds the ``k`` bytes at ``p``."""
    return PyBytes_GET_SIZE(known) == k and memcmp(PyBytes_AS_STRING(known), p, k) == 0


cdef Py_ssize_t _size_of(bytes buf, Py_ssize_t a, Py_ssize_t b) except -2:
    """A size token as ``int()`` reads it: digits here, anything else through ``int`` itself."""
    cdef const char* p = PyBytes_AS_STRING(buf)
    cdef Py_ssize_t v = 0, i
    if b - a > 18:
        return int(buf[a:b])
    for i in range(a, b):
        if not _is_digit(p[i]):
            return int(buf[a:b])
        v = v * 10 + (p[i] - 48)
    return v


cdef class FrameParser:
    """``gateway.wire.framing.FrameParser``, compiled."""

    cdef bytes _rest
    cdef bint _ack_runs
    cdef bytes _subject_b  # the last message's subject, as read and as decoded
    cdef str _subject

    def __init__(self, bint ack_runs=False):
        self._rest = b""
        self._ack_runs = ack_runs
        self._subject_b = b""
        self._subject = ""

    def feed(self, data):
        cdef bytes buf = (self._rest + data) if self._rest else bytes(data)
        cdef const char* p = PyBytes_AS_STRING(buf)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
        cdef Py_ssize_t pos = 0, eol, end, start, i, nargs, total, hdr_len
        cdef Py_ssize_t f[8]
        cdef Py_ssize_t ta[5]
        cdef Py_ssize_t tb[5]
        cdef bint is_hdr
        cdef char c0, c1, c2, c3
        cdef list frames = []
        cdef list found
        cdef bytes stream, consumer
        while pos < n:
            if self._ack_runs:
                end = _plain_ack(p, pos, n, f)
                if end >= 0:
                    found = []
                    stream = consumer = b""
                    while end >= 0:
                        # a run is mostly one consumer's acks: its names are made once
                        if not _same(stream, p + f[2], f[3] - f[2]):
                            stream = buf[f[2]:f[3]]
                        if not _same(consumer, p + f[4], f[5] - f[4]):
                            consumer = buf[f[4]:f[5]]
                        found.append((buf[f[0]:f[1]], stream, consumer, buf[f[6]:f[7]]))
                        pos = end
                        end = _plain_ack(p, pos, n, f)
                    frames.append(AckRun(found))
                    continue
            eol = _find_crlf(p, pos, n)
            if eol < 0:
                break
            is_hdr = False
            if eol - pos >= 4:
                c0 = p[pos] & 0xDF
                c1 = p[pos + 1] & 0xDF
                c2 = p[pos + 2] & 0xDF
                c3 = p[pos + 3] & 0xDF
                is_hdr = c0 == b"H"
                if not ((c0 == b"L" or is_hdr) and c1 == b"M" and c2 == b"S" and c3 == b"G"):
                    is_hdr = False
                    c0 = 0
            else:
                c0 = 0
            if c0 == 0:  # not a message: a control frame (its line, as the Python parser reads it)
                control_frame(buf[pos:eol], frames.append)
                pos = eol + 2
                continue
            # the line's arguments after the operation, up to five (more: the Python reading)
            nargs = 0
            i = pos + 4
            while True:
                while i < eol and _is_space(p[i]):
                    i += 1
                if i >= eol:
                    break
                if nargs == 5:
                    nargs = 6
                    break
                ta[nargs] = i
                while i < eol and not _is_space(p[i]):
                    i += 1
                tb[nargs] = i
                nargs += 1
            if nargs == 0 or (is_hdr and nargs < 2):
                raise ProtocolError(f"bad message line {buf[pos:eol]!r}")
            try:
                if nargs <= 5:
                    total = _size_of(buf, ta[nargs - 1], tb[nargs - 1])
                    hdr_len = _size_of(buf, ta[nargs - 2], tb[nargs - 2]) if is_hdr else 0
                else:
                    args = buf[pos + 4 : eol].split()
                    total = int(args[len(args) - 1])
                    hdr_len = int(args[len(args) - 2]) if is_hdr else 0
            except ValueError as exc:
                raise ProtocolError(f"bad message line {buf[pos:eol]!r}") from exc
            start = eol + 2
            end = start + total
            if end + 2 > n:
                break
            if _same(self._subject_b, p + ta[0], tb[0] - ta[0]):
                subject = self._subject  # publishers repeat subjects: one str for a run of them
            else:
                subject = PyUnicode_DecodeUTF8(p + ta[0], tb[0] - ta[0], NULL)
                self._subject_b = buf[ta[0] : tb[0]]
                self._subject = subject
            if (nargs == 2 and not is_hdr) or (nargs == 3 and is_hdr):
                reply = ""
            elif (nargs == 3 and not is_hdr) or (nargs == 4 and is_hdr):
                reply = PyUnicode_DecodeUTF8(p + ta[1], tb[1] - ta[1], NULL)
            else:
                args = buf[pos + 4 : eol].split()
                reply = reply_of(args[1 : len(args) - 2] if is_hdr else args[1 : len(args) - 1])
            if is_hdr:
                frames.append(Msg(subject, reply, buf[start : start + hdr_len], buf[start + hdr_len : end]))
            else:
                frames.append(Msg(subject, reply, None, buf[start:end]))
            pos = end + 2
        self._rest = buf[pos:] if pos < n else b""
        return frames


cdef struct Out:
    char* p
    Py_ssize_t n
    Py_ssize_t cap


cdef int _reserve(Out* o, Py_ssize_t more) except -1:
    cdef Py_ssize_t cap = o.cap
    cdef char* grown
    if o.n + more <= cap:
        return 0
    while cap < o.n + more:
        cap = cap * 2 if cap else 4096
    grown = <char*>PyMem_Realloc(o.p, cap)
    if grown == NULL:
        raise MemoryError()
    o.p = grown
    o.cap = cap
    return 0


cdef inline void _put(Out* o, const char* s, Py_ssize_t k) noexcept:
    memcpy(o.p + o.n, s, k)
    o.n += k


cdef inline int _put_int(Out* o, long long v) noexcept:
    """``v`` in decimal (at most 20 characters; room is reserved by the caller); its length."""
    cdef char tmp[24]
    cdef int k = 0, j
    cdef unsigned long long u
    if v < 0:
        o.p[o.n] = b"-"
        o.n += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        tmp[k] = <char>(48 + u % 10)
        k += 1
        u //= 10
        if u == 0:
            break
    for j in range(k):
        o.p[o.n + j] = tmp[k - 1 - j]
    o.n += k
    return k + (1 if v < 0 else 0)


cdef inline int _digits(long long v) noexcept:
    cdef int k = 1
    cdef unsigned long long u
    if v < 0:
        u = <unsigned long long>(-(v + 1)) + 1
        k = 2
    else:
        u = <unsigned long long>v
    while u >= 10:
        u //= 10
        k += 1
    return k


cdef const char* _utf8(object s, Py_ssize_t* size) except NULL:
    return PyUnicode_AsUTF8AndSize(s, size)


def delivery_frames(str inbox, str stream, str consumer, tuple queues, run, bint headers_only=False, pin=None):
    """``gateway.wire.framing.delivery_frames``, compiled (``headers_only`` and pinned runs are
    rare: they take the Python path)."""
    if headers_only or pin is not None:
        return _py.delivery_frames(inbox, stream, consumer, queues, run, headers_only, pin)
    cdef Py_ssize_t n_inbox, n_stream, n_consumer, n_groups = 0, n_subject, n_data, n_hdrs
    cdef const char* c_inbox = _utf8(inbox, &n_inbox)
    cdef const char* c_stream = _utf8(stream, &n_stream)
    cdef const char* c_consumer = _utf8(consumer, &n_consumer)
    cdef const char* c_groups = NULL
    cdef const char* c_subject
    cdef long long deliveries, seq, cseq, ts, pending
    cdef Py_ssize_t size = 0, chars, token_chars
    cdef bytes data, hdrs_b
    cdef Out o
    groups = None
    if queues:
        groups = " ".join(queues)
        c_groups = _utf8(groups, &n_groups)
    # the token's fixed part in characters: "$JS.ACK." + stream "." consumer and 5 "." separators
    chars = 8 + PyUnicode_GET_LENGTH(stream) + 1 + PyUnicode_GET_LENGTH(consumer) + 5
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        for msg, d in run:
            subject = msg.subject
            c_subject = _utf8(subject, &n_subject)
            data = msg.data  # bytes (a TypeError for anything else) and never None:
            if data is None:
                raise TypeError("a stored message without payload bytes")
            hdrs_b = msg.hdrs  # bytes or None
            n_data = PyBytes_GET_SIZE(data)
            n_hdrs = PyBytes_GET_SIZE(hdrs_b) if hdrs_b else 0
            deliveries, seq, cseq, ts, pending = d.deliveries, d.seq, d.cseq, msg.ts, d.pending
            token_chars = chars + _digits(deliveries) + _digits(seq) + _digits(cseq) + _digits(ts) + _digits(pending)
            size += PyUnicode_GET_LENGTH(subject) + token_chars + n_data + n_hdrs
            _reserve(&o, 5 + n_inbox + 3 + n_groups + 2 + n_stream + n_consumer + 5 * 21 + 16 + n_subject + 2 * 21 + 4 + n_hdrs + n_data + 2)
            _put(&o, b"HMSG " if n_hdrs else b"LMSG ", 5)
            _put(&o, c_inbox, n_inbox)
            _put(&o, b" + " if n_groups else b" ", 3 if n_groups else 1)
            _put(&o, b"$JS.ACK.", 8)
            _put(&o, c_stream, n_stream)
            _put(&o, b".", 1)
            _put(&o, c_consumer, n_consumer)
            _put(&o, b".", 1)
            _put_int(&o, deliveries)
            _put(&o, b".", 1)
            _put_int(&o, seq)
            _put(&o, b".", 1)
            _put_int(&o, cseq)
            _put(&o, b".", 1)
            _put_int(&o, ts)
            _put(&o, b".", 1)
            _put_int(&o, pending)
            _put(&o, b"@", 1)
            _put(&o, c_subject, n_subject)
            if n_groups:
                _put(&o, b" ", 1)
                _put(&o, c_groups, n_groups)
            _put(&o, b" ", 1)
            if n_hdrs:
                _put_int(&o, n_hdrs)
                _put(&o, b" ", 1)
                _put_int(&o, n_hdrs + n_data)
                _put(&o, b"\r\n", 2)
                _put(&o, PyBytes_AS_STRING(hdrs_b), n_hdrs)
            else:
                _put_int(&o, n_data)
                _put(&o, b"\r\n", 2)
            _put(&o, PyBytes_AS_STRING(data), n_data)
            _put(&o, b"\r\n", 2)
        return PyBytes_FromStringAndSize(o.p, o.n), size
    finally:
        PyMem_Free(o.p)


def encode_msgs(list frames):
    """``gateway.wire.framing.encode_msgs``, compiled: one buffer of ``LMSG`` frames."""
    cdef Py_ssize_t n_subject, n_data, total = 0
    cdef const char* c_subject
    cdef bytes data
    cdef Out o
    o.p = NULL
    o.n = 0
    o.cap = 0
    try:
        for subject, data in frames:
            if data is None:
                raise TypeError("a PubAck without body bytes")
            c_subject = _utf8(subject, &n_subject)
            n_data = PyBytes_GET_SIZE(data)
            _reserve(&o, 5 + n_subject + 1 + 21 + 2 + n_data + 2)
            _put(&o, b"LMSG ", 5)
            _put(&o, c_subject, n_subject)
            _put(&o, b" ", 1)
            _put_int(&o, n_data)
            _put(&o, b"\r\n", 2)
            _put(&o, PyBytes_AS_STRING(data), n_data)
            _put(&o, b"\r\n", 2)
        return PyBytes_FromStringAndSize(o.p, o.n) if o.n else b""
    finally:
        PyMem_Free(o.p)
