"""Cost of sealing (client) and opening (curator) reports, against parsing plaintext payloads.

Real reports: BSD fortunes (the demo's users) tokenised into sentences, sealed with HPKE
(X25519, HKDF-SHA256, ChaCha20-Poly1305) to a fresh curator key. One core.
Run: python benchmarks/bench_envelope.py [--reports N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from lac.common import envelope
from lac.common.text import sentences
from lac.common.v1 import reports_pb2
from lac.suite.data import load_users


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=int, default=5000)
    a = ap.parse_args()
    texts = (load_users() * (a.reports // 12_000 + 1))[: a.reports]
    contents = [
        reports_pb2.ReportContent(
            report_id=os.urandom(16), sentences=[reports_pb2.Sentence(tokens=s) for s in sentences(t)]
        )
        for t in texts
    ]
    with tempfile.TemporaryDirectory() as d:
        envelope.generate_key(d)
        ring = envelope.CuratorKeyRing.load(d)
    key = ring.public_key()

    t0 = time.perf_counter()
    sealed = [envelope.seal(c, key) for c in contents]
    t_seal = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in sealed:
        envelope.open_payload(s, ring)
    t_open = time.perf_counter() - t0
    plain = [envelope.seal_insecure(c) for c in contents]
    t0 = time.perf_counter()
    for p in plain:
        envelope.open_payload(p, None, allow_plaintext=True)
    t_plain = time.perf_counter() - t0

    n = len(contents)
    sizes = sorted(len(s.data) for s in sealed)
    raw = sum(len(p.data) for p in plain) / n
    print(
        f"{n} real reports (BSD fortunes), mean plaintext {raw:.0f} B; sealed sizes: median {sizes[n // 2]} B, "
        f"max {sizes[-1]} B, {len(set(sizes))} distinct (padding buckets)"
    )
    print(f"seal (client):  {n / t_seal:,.0f} reports/s ({1e6 * t_seal / n:.0f} µs each)")
    print(
        f"open (curator): {n / t_open:,.0f} reports/s ({1e6 * t_open / n:.0f} µs each); "
        f"plaintext parse baseline {n / t_plain:,.0f}/s -> HPKE costs {t_open / t_plain:.0f}x the parse"
    )
    print(f"=> opening a 1,000,000-report batch takes ~{1e6 * t_open / n:.0f} s on one core")


if __name__ == "__main__":
    main()
