"""Malformed input to every Shuffler RPC of a real ``lac shuffler serve`` process, while honest
clients submit: never UNKNOWN (nor INTERNAL), no crash, no honest report lost or duplicated,
bounded memory, at most one log line per rejected call and no traceback.

Raw-bytes channels send what a protobuf library never would: random bytes, truncated and
bit-flipped valid requests, huge repeated fields, invalid UTF-8 in string fields, fields of the
wrong wire type, length prefixes past the end, deeply nested groups. The seed is printed on
failure; set LAC_FUZZ_SEED to replay it (and LAC_FUZZ_CALLS for a longer run).
"""

from __future__ import annotations

import os
import random
import re
import threading
from collections import Counter

import grpc
import pytest
from shuffler_testkit import ServeProc, payload, tag_of, wait_for

from lac.common.rpc import Role
from lac.common.v1 import shuffler_pb2
from lac.shuffler.auth import add_clients
from lac.shuffler.server import ROLES
from lac.shuffler.wire import varint as _varint

SERVICE = "/lac.v1.Shuffler/"
UNARY = tuple(m for m in ROLES if m != "SubmitStream")  # Submit first
OPERATOR = tuple(m for m, roles in ROLES.items() if Role.CLIENT not in roles)  # called with the operator's token
FUZZ_CALLS = int(os.environ.get("LAC_FUZZ_CALLS", 1600))
HONEST_THREADS, FUZZ_THREADS = 2, 2
MAX_RSS_GROWTH = 100 * 1024**2


def _field(number: int, wire: int, body: bytes) -> bytes:
    key = _varint((number << 3) | wire)
    return key + (_varint(len(body)) + body if wire == 2 else body)


def _report_bytes(rng: random.Random, tag: bytes | None = None, size: int = 0) -> bytes:
    """A valid ClientReport (plaintext payload whose content's report id is ``tag``)."""
    return shuffler_pb2.ClientReport(
        idempotency_id=rng.randbytes(16), payload=payload(tag or rng.randbytes(16), size)
    ).SerializeToString()


def _submit(reports: list[bytes]) -> bytes:
    return b"".join(_field(1, 2, r) for r in reports)


class Fuzzer:
    """Random and mutated request bytes, one generator per kind of damage."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.kinds = [
            self.random_bytes,
            self.truncated,
            self.bit_flipped,
            self.huge_repeated,
            self.invalid_utf8,
            self.wrong_wire_type,
            self.bad_length,
            self.nested_groups,
            self.bad_values,
            self.valid,
        ]
        self.weights = [3, 3, 4, 1, 2, 2, 2, 1, 2, 1]

    def valid_request(self) -> bytes:
        return _submit([_report_bytes(self.rng) for _ in range(self.rng.randint(1, 4))])

    def random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.choice([0, 1, 2, 3, 7, 33, 500, 4000, 60_000]))

    def truncated(self) -> bytes:
        v = self.valid_request()
        return v[: self.rng.randrange(len(v))]

    def bit_flipped(self) -> bytes:
        v = bytearray(self.valid_request())
        for _ in range(self.rng.randint(1, 8)):
            v[self.rng.randrange(len(v))] ^= 1 << self.rng.randrange(8)
        return bytes(v)

    def huge_repeated(self) -> bytes:
        r = self.rng.random()
        if r < 0.4:
            return _field(1, 2, b"") * self.rng.choice([10_001, 300_000, 3_000_000])  # empty reports, too many
        if r < 0.7:
            one = _report_bytes(self.rng)
            return _submit([one] * 10_001)  # valid reports, one too many
        return _field(1, 2, _field(1, 2, b"i" * 16) + _field(2, 2, _field(3, 2, b"x" * 2_000_000)))  # huge payload

    def invalid_utf8(self) -> bytes:
        bad = self.rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"ok\xf0\x28\x8c\xbc", b"\x80" * 10])
        sealed = _field(1, 0, b"\x02") + _field(3, 2, b"data")
        if self.rng.random() < 0.5:  # ClientReport.crowd_id = 3 (string)
            report = _field(1, 2, self.rng.randbytes(16)) + _field(2, 2, sealed) + _field(3, 2, bad)
        else:  # SealedPayload.key_id = 2 (string)
            report = _field(1, 2, self.rng.randbytes(16)) + _field(2, 2, sealed + _field(2, 2, bad))
        return _field(1, 2, report)

    def wrong_wire_type(self) -> bytes:
        return self.rng.choice(
            [
                _field(1, 0, b"\x01"),  # reports as a varint
                _field(1, 5, b"\x00\x00\x00\x00"),  # ... as fixed32
                _field(1, 1, b"\x00" * 8),  # ... as fixed64
                _field(1, 2, _field(1, 0, b"\x05")),  # idempotency_id as a varint
                _field(1, 2, _field(2, 0, b"\x05")),  # payload as a varint
                _field(1, 2, _field(2, 2, _field(1, 2, b"\x01\x02"))),  # encoding (enum) as bytes
                _field(1, 2, _field(2, 2, _field(1, 0, b"\xff\xff\xff\xff\x0f"))),  # encoding out of range
                _field(1, 2, _field(3, 5, b"\x00\x00\x00\x00")),  # crowd_id as fixed32
                _varint((1 << 3) | 6) + b"\x00",  # wire type 6 does not exist
                _varint((0 << 3) | 2) + b"\x00",  # field number 0
            ]
        )

    def bad_length(self) -> bytes:
        return self.rng.choice(
            [
                _varint((1 << 3) | 2) + b"\xff\xff\xff\xff\x0f" + b"x" * 10,
                _varint((1 << 3) | 2) + _varint(1 << 40),
                _varint((1 << 3) | 2) + b"\x80" * 11,  # a varint that never ends
                self.valid_request() + b"\x0a\x10abc",
            ]
        )

    def nested_groups(self) -> bytes:
        depth = self.rng.choice([10, 200, 20_000])
        start, end = _varint((15 << 3) | 3), _varint((15 << 3) | 4)  # unknown field 15 as a group
        return start * depth + end * depth if self.rng.random() < 0.7 else start * depth

    def bad_values(self) -> bytes:
        rng = self.rng
        sealed = payload(rng.randbytes(16)).SerializeToString()
        return _field(
            1,
            2,
            rng.choice(
                [
                    _field(1, 2, b"short") + _field(2, 2, sealed),  # id too short
                    _field(1, 2, rng.randbytes(100)) + _field(2, 2, sealed),  # id too long
                    _field(1, 2, rng.randbytes(16)) + _field(2, 2, _field(3, 2, b"x")),  # no encoding
                    _field(1, 2, rng.randbytes(16)) + _field(2, 2, _field(1, 0, b"\x02")),  # empty payload
                    _field(1, 2, rng.randbytes(16)) + _field(2, 2, _field(1, 0, b"\x02") + _field(3, 2, b"x" * 70_000)),
                    _field(1, 2, rng.randbytes(16)) + _field(2, 2, _field(1, 0, b"\x01") + _field(3, 2, b"x" * 100)),
                    _field(1, 2, rng.randbytes(16))
                    + _field(2, 2, sealed)
                    + _field(3, 2, b"c" * 300),  # crowd id too long
                    _field(1, 2, rng.randbytes(16)),  # no payload at all
                ]
            ),
        )

    def valid(self) -> bytes:
        return self.valid_request()

    def message(self) -> bytes:
        return self.rng.choices(self.kinds, self.weights)[0]()


def _tags(sink) -> list[bytes]:
    """Report ids of every report the curator received (fuzzed payloads that are no ReportContent skipped)."""
    from google.protobuf.message import DecodeError

    out = []
    for batch in sink.batches().values():
        for p in batch.reports:
            try:
                out.append(tag_of(p))
            except DecodeError:
                pass
    return out


def _fuzz(address: str, token: str, operator: str, fuzzer: Fuzzer, calls: int, codes: Counter, errors: list):
    """Send ``calls`` malformed calls, spread over every RPC; count the status codes."""
    md_client = (("authorization", f"Bearer {token}"),)
    md_operator = (("authorization", f"Bearer {operator}"),)
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 * 1024**2)]) as ch:
        unary = {m: ch.unary_unary(SERVICE + m, request_serializer=None, response_deserializer=None) for m in UNARY}
        stream = ch.stream_unary(SERVICE + "SubmitStream", request_serializer=None, response_deserializer=None)
        for i in range(calls):
            method = fuzzer.rng.choice(["Submit", "Submit", "SubmitStream", "SubmitStream", *UNARY[1:]])
            md = md_operator if method in OPERATOR else md_client
            try:
                if method == "SubmitStream":
                    msgs = [fuzzer.message() for _ in range(fuzzer.rng.randint(1, 4))]
                    stream(iter(msgs), metadata=md, timeout=30)
                else:
                    unary[method](fuzzer.message(), metadata=md, timeout=30)
                codes[(method, "OK")] += 1
            except grpc.RpcError as exc:
                codes[(method, exc.code().name)] += 1
                if exc.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
                    errors.append((method, exc.code().name, exc.details()))


def _honest(address: str, tokens: list[str], stop: threading.Event, acked: list, failures: list, rng):
    """Valid reports of distinct clients, Submit and SubmitStream, until ``stop``."""
    from lac.common.v1 import shuffler_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        stub = shuffler_pb2_grpc.ShufflerStub(ch)
        i = 0
        while not stop.is_set():
            md = (("authorization", f"Bearer {tokens[i % len(tokens)]}"),)
            reports = [shuffler_pb2.ClientReport.FromString(_report_bytes(rng)) for _ in range(rng.randint(1, 5))]
            try:
                if i % 3 == 2 and len(reports) > 1:
                    half = len(reports) // 2
                    stub.SubmitStream(
                        iter(
                            [
                                shuffler_pb2.SubmitRequest(reports=reports[:half]),
                                shuffler_pb2.SubmitRequest(reports=reports[half:]),
                            ]
                        ),
                        metadata=md,
                        timeout=30,
                    )
                else:
                    stub.Submit(shuffler_pb2.SubmitRequest(reports=reports), metadata=md, timeout=30)
                acked.extend(tag_of(r.payload) for r in reports)
            except grpc.RpcError as exc:
                failures.append((exc.code().name, exc.details()))
            i += 1


@pytest.mark.slow
def test_malformed_input_to_every_rpc_never_unknown_never_crashes(tmp_path, sink):
    seed = int(os.environ.get("LAC_FUZZ_SEED") or int.from_bytes(os.urandom(8), "big"))
    master = random.Random(seed)
    state = tmp_path / "state"
    names = [f"fuzz{i}" for i in range(FUZZ_THREADS)] + [f"honest{i}" for i in range(40)]
    tokens = dict(zip(names, add_clients(state / "clients.tokens", names)))
    operator = add_clients(state / "clients.tokens", ["ops"], role="operator")[0]
    # The fuzzers' own valid reports are stored too: give every client room (and tell the curator so).
    from lac.common.deployment import Deployment

    sink.deployment = Deployment(reports_per_window=1_000_000)
    proc = ServeProc(
        [
            "--state-dir",
            str(state),
            "--curator",
            sink.address,
            "--auth",
            "token",
            "--insecure",
            "--allow-plaintext-payloads",
            "--min-batch",
            "1",
            "--reports-per-window",
            "1000000",
            "--forward-retry-max-seconds",
            "0.2",
        ],
        tmp_path / "proc",
    )
    try:
        stop = threading.Event()
        acked: list = []
        honest_failures: list = []
        honest_tokens = [tokens[n] for n in names if n.startswith("honest")]
        honest = [
            threading.Thread(
                target=_honest,
                args=(
                    proc.address,
                    honest_tokens[i::HONEST_THREADS],
                    stop,
                    acked,
                    honest_failures,
                    random.Random(master.random()),
                ),
            )
            for i in range(HONEST_THREADS)
        ]
        for t in honest:
            t.start()
        wait_for(lambda: len(acked) > 50)
        lines_before = len(proc.lines)
        codes: Counter = Counter()
        errors: list = []
        rss_rounds, fuzz_seconds = proc.rss_over_rounds(
            2,
            lambda: [
                threading.Thread(
                    target=_fuzz,
                    args=(
                        proc.address,
                        tokens[f"fuzz{i}"],
                        operator,
                        Fuzzer(random.Random(master.random())),
                        FUZZ_CALLS // FUZZ_THREADS // 2,
                        codes,
                        errors,
                    ),
                )
                for i in range(FUZZ_THREADS)
            ],
            600,
        )
        rss_before = rss_rounds[0]
        stop.set()
        for t in honest:
            t.join(60)
        fuzz_lines = proc.lines[lines_before:]
        rss_after = proc.rss_bytes()

        context = f"seed {seed}; codes {dict(codes)}"
        assert sum(codes.values()) >= 1000, context
        assert not errors, f"{context}; UNKNOWN/INTERNAL: {errors[:5]}"
        every_rpc = set(shuffler_pb2.DESCRIPTOR.services_by_name["Shuffler"].methods_by_name)
        assert {m for m, _ in codes} == set(UNARY) | {"SubmitStream"} == every_rpc, context
        assert not honest_failures, f"{context}; honest calls failed: {honest_failures[:5]}"
        assert proc.process.poll() is None, "the shuffler died"
        assert proc.health("") == "SERVING" and proc.health("lac.v1.Shuffler") == "SERVING"
        # Measured on 2026-11-25 in one round of all the calls: 51-84 MiB, once 102 MiB in CI, the same on the code
        # before the key-only release; the gross leaks this guards against (GiBs) are far above.
        assert rss_rounds[2] - rss_rounds[1] < 0.6 * MAX_RSS_GROWTH, rss_rounds
        assert rss_after - rss_before < 1.5 * MAX_RSS_GROWTH, rss_rounds

        # Drain: a batch takes one report per client, so flush until nothing is buffered or pending.
        from lac.common.v1 import shuffler_pb2_grpc

        md = (("authorization", f"Bearer {operator}"),)
        with grpc.insecure_channel(proc.address) as ch:
            stub = shuffler_pb2_grpc.ShufflerStub(ch)

            def drained():
                stub.Flush(shuffler_pb2.FlushRequest(), metadata=md, timeout=30)
                s = stub.GetStatus(shuffler_pb2.ShufflerStatusRequest(), metadata=md, timeout=30)
                return s.buffered_reports == 0 and s.batches_pending == 0

            wait_for(drained, timeout=120)
        got = Counter(_tags(sink))
        missing = [t for t in acked if got[t] != 1]
        assert not missing, f"{len(missing)} acknowledged honest reports did not reach the curator exactly once"

        rejected = sum(n for (_, code), n in codes.items() if code != "OK")
        text = "".join(fuzz_lines)
        per_call_line = re.compile(r" lac\.(common\.rpc|shuffler\.server): /lac\.v1\.Shuffler/\w+: [A-Z_]+: ")
        per_call = [line for line in fuzz_lines if per_call_line.search(line)]
        assert len(per_call) <= rejected, (len(per_call), rejected)
        other = [
            line
            for line in fuzz_lines
            if not per_call_line.search(line) and not re.search(r"released batch|curator acknowledged batch", line)
        ]
        assert len(other) <= 5, other[:20]
        assert "Traceback" not in text and " ERROR " not in text, text[-5000:]
        print(
            f"fuzz: {sum(codes.values())} calls in {fuzz_seconds:.1f}s, {dict(codes)}; honest reports "
            f"{len(acked)}; RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB (after each round: "
            f"{[r // 2**20 for r in rss_rounds[1:]]}); seed {seed}"
        )
    finally:
        proc.stop()
