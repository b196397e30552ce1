"""A mutation fuzzer over a running daemon's gRPC listener: real calls, mangled.

Starts `aotid serve --grpc-listen` on a fresh store serving one compiled
model, and sends --count connections, each made from a valid exchange of
HTTP/2 frames (gRPC calls: ModelInfer with raw or typed contents, health,
metadata, the repository index) mangled at one of its layers: the protobuf
message (bytes flipped, inserted, cut; fields duplicated; lengths and
varints past any size), the gRPC message prefix (lengths, the compressed
flag), the header block (HPACK bytes, pseudo-headers, content-type, timeouts,
encodings, tokens), the frames (type, flags, stream id, declared length;
frames dropped, repeated, reordered) or the raw bytes. It checks that:
  - whatever comes back is well-formed HTTP/2 frames, starting with the
    server's SETTINGS, and its header blocks decode;
  - no call is answered INTERNAL or UNKNOWN by aotid (the server's own
    refusal to parse a message, which gRPC reports as INTERNAL, aside):
    a mangled call is the client's error;
  - the daemon stays alive and live (a ServerLive call every 200
    connections);
  - afterwards a good ModelInfer still answers as eager PyTorch did
    (tests/models' cases.json), as it did before;
  - the daemon stops cleanly (exit status 0) on SIGTERM.
HTTP/2 and protobuf are written and read by hand (no packages beyond the
standard library). Bounded by --count, --max-seconds and a per-connection
read timeout; the seed makes a run repeatable (a failure prints the seed,
the case number and what was sent).

usage: grpc_mutation.py AOTID TESTDATA [--count N] [--seed S]
"""

import argparse
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SERVICE = "/inference.GRPCInferenceService/"
GRPC_INTERNAL, GRPC_UNKNOWN = 13, 2


# --- protobuf, by hand ------------------------------------------------------

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    if wire == 0:
        return varint(num << 3) + varint(payload)
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def string(num, text):
    return field(num, 2, text.encode() if isinstance(text, str) else text)


def packed(num, values, enc):
    return field(num, 2, b"".join(enc(v) for v in values))


def read_varint(data, at):
    n = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("bad varint")
        b = data[at]
        at += 1
        n |= (b & 0x7f) << shift
        shift += 7
        if not b & 0x80:
            return n, at


def read_fields(data):
    """(number, wire type, value) of each field of a message."""
    at, out = 0, []
    while at < len(data):
        key, at = read_varint(data, at)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, at = read_varint(data, at)
        elif wire == 2:
            n, at = read_varint(data, at)
            if at + n > len(data):
                raise ValueError("field past the end")
            value, at = data[at:at + n], at + n
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((num, wire, value))
    return out


def infer_tensor(name, datatype, shape, contents=b"", params=b""):
    body = string(1, name) + string(2, datatype) + packed(3, shape, varint) + params
    return field(5, 2, body + (field(5, 2, contents) if contents else b""))


def f32(v):
    return struct.pack("<f", v)


def infer_request(x, rows, typed=False, outputs=(), extra=b""):
    msg = string(1, "m") + string(3, "fuzz")
    if typed:
        msg += infer_tensor("x", "FP32", [rows, 8], packed(6, x, f32))
    else:
        msg += infer_tensor("x", "FP32", [rows, 8]) + field(7, 2, b"".join(f32(v) for v in x))
    for name, params in outputs:
        msg += field(6, 2, string(1, name) + params)
    return msg + extra


def param_entry(key, choice):
    """One entry of a map<string, InferParameter> (field 4 or 2)."""
    return string(1, key) + field(2, 2, choice)


# --- HTTP/2 and HPACK, by hand ---------------------------------------------

def frame(ftype, flags, stream, payload, length=None):
    n = len(payload) if length is None else length
    return struct.pack(">I", n)[1:] + bytes([ftype & 0xff, flags & 0xff]) + struct.pack(">I", stream & 0x7fffffff) \
        + payload


def hpack_int(high, bits, v):
    top = (1 << bits) - 1
    if v < top:
        return bytes([high | v])
    out = bytearray([high | top])
    v -= top
    while v >= 128:
        out.append(0x80 | (v & 0x7f))
        v >>= 7
    out.append(v)
    return bytes(out)


def literal(name, value):
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    return b"\x00" + hpack_int(0, 7, len(name)) + name + hpack_int(0, 7, len(value)) + value


def call_headers(method, extra=()):
    fields = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "127.0.0.1"),
              ("content-type", "application/grpc"), ("te", "trailers")] + list(extra)
    return fields


def block(fields):
    return b"".join(literal(k, v) for k, v in fields)


def grpc_message(msg, length=None, compressed=0):
    return bytes([compressed]) + struct.pack(">I", len(msg) if length is None else length & 0xffffffff) + msg


STATIC = [(":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
          (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
          (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
          ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
          ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
          ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
          ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
          ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
          ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
          ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
          ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""),
          ("refresh", ""), ("retry-after", ""), ("server", ""), ("set-cookie", ""),
          ("strict-transport-security", ""), ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""),
          ("via", ""), ("www-authenticate", "")]


class Hpack:
    """The decoder of one connection's header blocks (RFC 7541); a Huffman
    string reads as '<huffman>'."""

    def __init__(self):
        self.table, self.size, self.max = [], 0, 4096

    def _int(self, data, at, bits):
        top = (1 << bits) - 1
        v = data[at] & top
        at += 1
        if v < top:
            return v, at
        shift = 0
        while True:
            if at >= len(data) or shift > 56:
                raise ValueError("bad integer")
            b = data[at]
            at += 1
            v += (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                return v, at

    def _str(self, data, at):
        if at >= len(data):
            raise ValueError("no string")
        huff = data[at] & 0x80
        n, at = self._int(data, at, 7)
        if at + n > len(data):
            raise ValueError("string past the end")
        return ("<huffman>" if huff else data[at:at + n].decode("latin-1")), at + n

    def _entry(self, i):
        if 1 <= i <= len(STATIC):
            return STATIC[i - 1]
        i -= len(STATIC) + 1
        if 0 <= i < len(self.table):
            return self.table[i]
        raise ValueError(f"index {i} past the tables")

    def _evict(self):
        while self.size > self.max and self.table:
            k, v = self.table.pop()
            self.size -= len(k) + len(v) + 32

    def decode(self, data):
        at, out = 0, []
        while at < len(data):
            b = data[at]
            if b & 0x80:
                i, at = self._int(data, at, 7)
                out.append(self._entry(i))
                continue
            if b & 0xe0 == 0x20:
                self.max, at = self._int(data, at, 5)
                self._evict()
                continue
            inc = b & 0xc0 == 0x40
            i, at = self._int(data, at, 6 if inc else 4)
            if i == 0:
                name, at = self._str(data, at)
            else:
                name = self._entry(i)[0]
            value, at = self._str(data, at)
            out.append((name, value))
            if inc:
                self.table.insert(0, (name, value))
                self.size += len(name) + len(value) + 32
                self._evict()
        return out


class Exchange:
    """What the server sent on one connection, read as HTTP/2."""

    def __init__(self):
        self.frames, self.ends, self.bodies = [], {}, {}
        self.closed = False


def read_exchange(sock, timeout, want_stream=None):
    """Frames until the connection closes, `want_stream` ends, or `timeout`
    passes with nothing new. Raises AssertionError on bytes that are not
    HTTP/2 frames or headers that do not decode."""
    ex, buf, hpack, pending = Exchange(), b"", Hpack(), {}
    last = time.time()
    while True:
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            ftype, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7fffffff
            payload, buf = buf[9:9 + n], buf[9 + n:]
            if not ex.frames and ftype != SETTINGS:
                raise AssertionError(f"the server's first frame is type {ftype}, not SETTINGS")
            ex.frames.append((ftype, flags, stream, payload))
            if ftype in (HEADERS, CONTINUATION):
                pending[stream] = pending.get(stream, b"") + payload
                if flags & END_HEADERS:
                    try:
                        fields = dict(hpack.decode(pending.pop(stream)))
                    except (ValueError, IndexError) as e:
                        raise AssertionError(f"server header block does not decode: {e}")
                    if flags & END_STREAM:
                        ex.ends[stream] = fields
            elif ftype == DATA:
                ex.bodies[stream] = ex.bodies.get(stream, b"") + payload
            elif ftype == RST_STREAM:
                ex.ends[stream] = {"rst": int.from_bytes(payload[:4], "big")}
            if want_stream is not None and want_stream in ex.ends:
                return ex
        left = timeout - (time.time() - last)
        if left <= 0:
            return ex
        r, _, _ = select.select([sock], [], [], left)
        if not r:
            return ex
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout, OSError):
            chunk = b""
        if not chunk:
            ex.closed = True
            return ex
        buf += chunk
        last = time.time()


# --- the exchanges mutated --------------------------------------------------

def seeds(case):
    """Valid exchanges: (frames, messages) where frames is a list of
    [type, flags, stream, payload] after the preface and SETTINGS."""
    x1 = case["inputs"][0]["data"]
    rows = case["inputs"][0]["shape"][0]
    bool_param = field(1, 0, 1)

    def call(method, msg, stream=1, extra=()):
        return [[HEADERS, END_HEADERS, stream, block(call_headers(method, extra))],
                [DATA, END_STREAM, stream, grpc_message(msg)]]

    settings = [SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20) + struct.pack(">HI", 3, 100)]
    out = [
        call("ModelInfer", infer_request(x1, rows)),
        call("ModelInfer", infer_request(x1, rows, typed=True)),
        call("ModelInfer", infer_request(x1, rows, outputs=[("y", field(2, 2, param_entry("binary_data",
                                                                                          bool_param)))])),
        call("ModelInfer", infer_request(x1, rows, extra=field(4, 2, param_entry("priority", field(2, 0, 1))))),
        call("ModelInfer", infer_request(x1, rows), extra=[("grpc-timeout", "5S"), ("user-agent", "fuzz")]),
        call("ServerLive", b""),
        call("ServerReady", b""),
        call("ModelReady", string(1, "m")),
        call("ModelMetadata", string(1, "m") + string(2, "1")),
        call("ServerMetadata", b""),
        call("RepositoryIndex", field(2, 0, 1)),
        call("RepositoryModelUnload", string(2, "none")),
        # two calls on one connection, interleaved, with a PING and a window update
        call("ModelInfer", infer_request(x1, rows), 1) + [[PING, 0, 0, b"12345678"],
                                                          [WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 16)]]
        + call("ModelInfer", infer_request(x1, rows, typed=True), 3),
        # the header block split into a CONTINUATION, and a padded DATA frame
        [[HEADERS, 0, 1, block(call_headers("ModelInfer"))[:20]],
         [CONTINUATION, END_HEADERS, 1, block(call_headers("ModelInfer"))[20:]],
         [DATA, END_STREAM | PADDED, 1, b"\x04" + grpc_message(infer_request(x1, rows)) + b"\x00" * 4]],
        # the message in two DATA frames
        [[HEADERS, END_HEADERS, 1, block(call_headers("ModelInfer"))],
         [DATA, 0, 1, grpc_message(infer_request(x1, rows))[:17]],
         [DATA, END_STREAM, 1, grpc_message(infer_request(x1, rows))[17:]]],
    ]
    return [[settings] + s for s in out]


INTERESTING_VARINTS = [0, 1, 0x7f, 0x80, 0xffffffff, 1 << 31, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
HEADER_MANGLES = [(":path", SERVICE + "Nope"), (":path", "/"), (":path", SERVICE + "ModelInfer?x=1"),
                  (":method", "GET"), (":scheme", "ftp"), ("content-type", "application/json"),
                  ("content-type", "application/grpc+proto"), ("te", "gzip"), ("grpc-timeout", "0n"),
                  ("grpc-timeout", "99999999H"), ("grpc-timeout", "x"), ("grpc-encoding", "gzip"),
                  ("grpc-encoding", "snappy"), ("grpc-accept-encoding", "\xff"), ("authorization", "Bearer x"),
                  ("connection", "keep-alive"), ("Upper", "case"), ("x-bin", "\x00\xff"), ("", "empty"),
                  (":status", "200"), ("host", "evil.example")]


def mutate_message(rng, msg):
    """The protobuf bytes of one message, mangled."""
    data = bytearray(msg)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        at = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:
            del data[at:at + rng.randint(1, 16)]
        elif op == 3 and data:  # a field repeated (protobuf merges or appends)
            try:
                fields = read_fields(bytes(data))
            except ValueError:
                continue
            if fields:
                num, wire, value = rng.choice(fields)
                data += field(num, wire, value)
        elif op == 4:  # a field with a varint or length past any size
            num = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 15, 536870911])
            v = rng.choice(INTERESTING_VARINTS)
            data[at:at] = varint(num << 3 | rng.choice([0, 2])) + varint(v)
        elif op == 5:  # an input with a shape past any size, or a negative one
            dims = [rng.choice([-1, 0, 1, 8, 1 << 31, 1 << 62, (1 << 63) - 1]) for _ in range(rng.randint(0, 9))]
            dtype = rng.choice(["FP32", "FP16", "BF16", "INT8", "UINT64", "BOOL", "BYTES", "fp32", "", "\xff"])
            contents = packed(rng.choice([1, 2, 3, 4, 5, 6, 7]), [rng.randrange(1 << 32) for _ in range(3)], varint)
            data += infer_tensor(rng.choice(["x", "y", "", "x\x00"]), dtype, dims, contents if rng.random() < 0.5 else b"")
        elif op == 6:  # raw contents added or removed
            data += field(7, 2, bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 31, 32, 96]))))
        elif op == 7 and data:
            del data[rng.randrange(len(data)):]
    return bytes(data)


def mutate(rng, exchange):
    """One valid exchange with one of its layers mangled; the bytes to send."""
    frames = [list(f) for f in exchange]
    layer = rng.randrange(6)
    if layer == 0:  # the protobuf message, re-framed correctly so it reaches the decode
        for f in frames:
            if f[0] == DATA and len(f[3]) >= 5 and not f[1] & PADDED:
                f[3] = grpc_message(mutate_message(rng, f[3][5:]))
    elif layer == 1:  # the gRPC message prefix
        for f in frames:
            if f[0] == DATA and len(f[3]) >= 5 and not f[1] & PADDED:
                msg = f[3][5:]
                f[3] = grpc_message(msg, length=rng.choice([0, len(msg) - 1, len(msg) + 1, 1 << 20, (1 << 32) - 1,
                                                            len(msg) * 2]),
                                    compressed=rng.choice([0, 1, 2, 0xff]))
                break
    elif layer == 2:  # the header block
        for f in frames:
            if f[0] == HEADERS:
                if rng.random() < 0.5 and f[1] & END_HEADERS:
                    fields = call_headers(rng.choice(["ModelInfer", "ServerLive", "Nope"]))
                    for _ in range(rng.randint(1, 3)):
                        k, v = rng.choice(HEADER_MANGLES)
                        if rng.random() < 0.5:
                            fields = [(a, b) for a, b in fields if a != k]
                        fields.insert(rng.randrange(len(fields) + 1), (k, v))
                    if rng.random() < 0.2:
                        fields.append(("x-big", "v" * rng.choice([100, 20000, 70000])))
                    f[3] = block(fields)
                else:
                    b = bytearray(f[3])
                    for _ in range(rng.randint(1, 4)):
                        at = rng.randrange(len(b) + 1)
                        b[at:at] = rng.choice([b"\xff", b"\x80", b"\x3f\xe1\x1f", b"\x7f\xff\xff\xff\xff\x0f",
                                               b"\x0f\xff\xff\xff\xff\x7f", b"\xbf", b"\x20", b"\x00\x81"])
                    f[3] = bytes(b)
                break
    elif layer == 3:  # frame fields
        f = rng.choice(frames)
        what = rng.randrange(5)
        if what == 0:
            f[0] = rng.choice([DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY,
                               WINDOW_UPDATE, CONTINUATION, 0x0a, 0xff])
        elif what == 1:
            f[1] = rng.randrange(256)
        elif what == 2:
            f[2] = rng.choice([0, 2, 3, 0x7fffffff, f[2] + 2])
        elif what == 3:
            f.append(rng.choice([0, len(f[3]) - 1, len(f[3]) + 1, 16385, 0xffffff]))  # declared length
        else:
            f[3] = f[3][:rng.randrange(len(f[3]) + 1)]
    elif layer == 4:  # frames dropped, repeated, reordered, or control frames added
        op = rng.randrange(4)
        i = rng.randrange(len(frames))
        if op == 0:
            del frames[i]
        elif op == 1:
            frames.insert(i, list(frames[i]))
        elif op == 2:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        else:
            frames.insert(i, rng.choice([
                [RST_STREAM, 0, 1, struct.pack(">I", 8)], [WINDOW_UPDATE, 0, 1, struct.pack(">I", 0)],
                [WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7fffffff)], [SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 31)],
                [SETTINGS, 0, 0, struct.pack(">HI", 5, 1)], [SETTINGS, ACK, 0, b"x"], [PING, 0, 1, b"12345678"],
                [PRIORITY, 0, 1, struct.pack(">IB", 1, 0)], [GOAWAY, 0, 0, struct.pack(">II", 0, 0)],
                [PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2)], [0xfa, 0, 0, b"unknown"]]))
    out = b"".join(frame(*f) if len(f) == 4 else frame(f[0], f[1], f[2], f[3], length=f[4]) for f in frames)
    if layer == 5:  # the bytes themselves
        data = bytearray(out)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data) + 1)
            op = rng.randrange(4)
            if op == 0 and data:
                data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
            elif op == 1:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif op == 2 and data:
                del data[at:at + rng.randint(1, 16)]
            else:
                del data[rng.randrange(len(data) + 1):]
        out = bytes(data)
    return PREFACE + out


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def send(port, data, timeout):
    s = connect(port)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        return read_exchange(s, timeout)
    finally:
        s.close()


def good_call(port, method, msg, timeout=30):
    """A well-formed call on its own connection: (grpc-status, message, body)."""
    s = connect(port)
    try:
        s.sendall(PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, END_HEADERS, 1, block(call_headers(method)))
                  + frame(DATA, END_STREAM, 1, grpc_message(msg)))
        ex = read_exchange(s, timeout, want_stream=1)
    finally:
        s.close()
    end = ex.ends.get(1)
    if end is None:
        raise AssertionError(f"{method}: no answer ({len(ex.frames)} frames, closed={ex.closed})")
    body = ex.bodies.get(1, b"")
    return int(end.get("grpc-status", "-1")), end.get("grpc-message", ""), body[5:]


def infer_outputs(port, case):
    x = case["inputs"][0]["data"]
    status, message, body = good_call(port, "ModelInfer", infer_request(x, case["inputs"][0]["shape"][0]))
    if status != 0:
        raise AssertionError(f"ModelInfer: grpc-status {status} {message}")
    fields = read_fields(body)
    outs = [dict((n, v) for n, _, v in read_fields(v)) for n, _, v in fields if n == 5]
    raws = [v for n, _, v in fields if n == 6]
    assert len(outs) == 1 and len(raws) == 1, fields
    assert outs[0][1] == b"y" and outs[0][2] == b"FP32", outs
    return list(struct.unpack(f"<{len(raws[0]) // 4}f", raws[0]))


def check_against_eager(got, case):
    want = case["outputs"][0]["data"]
    assert len(got) == len(want), (got, want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-5 + 1e-5 * abs(w), f"y[{k}] = {g}, eager {w}"


def start_daemon(aotid, store, config, log_path):
    log = open(log_path, "wb")
    proc = subprocess.Popen([aotid, "--store", store, "serve", "--config", config, "--listen", "127.0.0.1:0",
                             "--grpc-listen", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        text = open(log_path, "rb").read().decode("utf-8", "replace")
        m = re.search(r"gRPC serving on 127\.0\.0\.1:(\d+)", text)
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit("the daemon did not start:\n" + open(log_path, "rb").read().decode("utf-8", "replace"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("aotid")
    ap.add_argument("testdata")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("AOTID_FUZZ_SEED", "1")))
    ap.add_argument("--timeout", type=float, default=0.08)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    case = json.load(open(os.path.join(args.testdata, "cases.json")))["mlp"][1]

    with tempfile.TemporaryDirectory(prefix="aotid-grpc-mutation-") as tmp:
        store = os.path.join(tmp, "store")
        subprocess.run([args.aotid, "--store", store, "add", os.path.join(args.testdata, "mlp_so.pt2"),
                        "--name", "m"], check=True, capture_output=True)
        config = os.path.join(tmp, "aotid.toml")
        with open(config, "w") as f:  # a small body limit, so that lengths past it are met often
            f.write("[server]\nmax_body_bytes = 65536\n")
        log_path = os.path.join(tmp, "daemon.log")
        proc, port = start_daemon(args.aotid, store, config, log_path)
        try:
            deadline = time.time() + 120
            while True:
                status, _, body = good_call(port, "ModelReady", string(1, "m"))
                if status == 0 and read_fields(body) == [(1, 0, 1)]:
                    break
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit("the model did not become ready over gRPC")
                time.sleep(0.2)
            before = infer_outputs(port, case)
            check_against_eager(before, case)

            base = seeds(case)
            statuses, resets, goaways = {}, {}, {}
            t0 = time.time()
            done = 0
            for i in range(args.count):
                if time.time() - t0 > args.max_seconds:
                    break
                data = mutate(rng, rng.choice(base))
                try:
                    ex = send(port, data, args.timeout)
                except AssertionError as e:
                    raise SystemExit(f"case {i} (seed {args.seed}): {e}\nsent: {data[:600]!r}")
                for stream, end in ex.ends.items():
                    if "rst" in end:
                        resets[end["rst"]] = resets.get(end["rst"], 0) + 1
                        continue
                    code = int(end.get("grpc-status", "-1")) if end.get("grpc-status", "").isdigit() else -1
                    statuses[code] = statuses.get(code, 0) + 1
                    message = end.get("grpc-message", "")
                    # gRPC answers INTERNAL itself for a message protobuf cannot parse.
                    if code == GRPC_UNKNOWN or (code == GRPC_INTERNAL and "parse" not in message.lower()):
                        raise SystemExit(f"case {i} (seed {args.seed}), stream {stream}: grpc-status {code} "
                                         f"{message!r}\nsent: {data[:600]!r}")
                for ftype, _, _, payload in ex.frames:
                    if ftype == GOAWAY and len(payload) >= 8:
                        code = int.from_bytes(payload[4:8], "big")
                        goaways[code] = goaways.get(code, 0) + 1
                if proc.poll() is not None:
                    raise SystemExit(f"the daemon died (status {proc.returncode}) after case {i} "
                                     f"(seed {args.seed}); sent: {data[:600]!r}")
                if i % 200 == 199:
                    status, message, body = good_call(port, "ServerLive", b"")
                    if status != 0 or read_fields(body) != [(1, 0, 1)]:
                        raise SystemExit(f"not live after case {i}: {status} {message}")
                done += 1
            elapsed = time.time() - t0

            after = infer_outputs(port, case)
            check_against_eager(after, case)
            assert after == before, (before, after)
            print(f"{done} mutated connections in {elapsed:.1f} s (seed {args.seed}); "
                  f"grpc-status: {dict(sorted(statuses.items()))}; RST_STREAM codes: {dict(sorted(resets.items()))}; "
                  f"GOAWAY codes: {dict(sorted(goaways.items()))}")
            if done < min(args.count, 500):
                raise SystemExit(f"only {done} connections in {args.max_seconds} s")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise SystemExit("the daemon did not stop on SIGTERM")
        if proc.returncode != 0:
            sys.stdout.write(open(log_path, "rb").read().decode("utf-8", "replace")[-4000:])
            raise SystemExit(f"the daemon exited with status {proc.returncode}")


if __name__ == "__main__":
    main()
