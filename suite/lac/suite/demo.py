"""``lac demo``: the whole pipeline on this machine, with real data and real processes.

Curator and shuffler run as separate processes on loopback; simulated users (BSD
fortunes) privatize their text with the client SDK and submit it over gRPC; the
shuffler releases one shuffled batch; the curator releases the n-gram distribution
with BayesianDP; the summary compares it with the non-private distributions.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from lac.common import tls
from lac.common.progress import Progress
from lac.common.text import sentences
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2, shuffler_pb2_grpc
from lac.suite import procs


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run curator + shuffler + simulated users end to end",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--users", type=int, default=12_327, help="simulated users, one report each (at most 12,327)")
    p.add_argument("--local-epsilon", type=float, default=15.0, help="client metric-DP ε per word")
    p.add_argument("--vocab-size", type=int, default=20_000, help="embedding vocabulary (most frequent words)")
    p.add_argument("--epsilon", type=float, default=1.0, help="curator release ε")
    p.add_argument("--delta", type=float, default=1e-6, help="curator release δ")
    p.add_argument("--S", dest="s", type=float, default=0.01, help="BayesianDP decay slope S")
    p.add_argument("--rho", type=float, default=0.5, help="BayesianDP private/public weight ρ")
    p.add_argument("--top", type=int, default=10, help="n-grams to show per order")
    p.add_argument("--workdir", type=Path, default=None, help="keep state and logs here (default: a temp dir)")
    p.set_defaults(func=run)


def kl(p: np.ndarray, log_q: np.ndarray) -> float:
    """KL(p ‖ q) in nats for a probability vector p and log-probabilities log q."""
    nz = p > 0
    return float(np.sum(p[nz] * (np.log(p[nz]) - log_q[nz])))


def run(args) -> int:
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="lac-demo-") as tmp:
            return _run(args, Path(tmp))
    return _run(args, args.workdir)


def _run(args, workdir: Path) -> int:
    from lac.client.embedding import glove_default
    from lac.client.localizer import Localizer
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.submit import ShufflerClient
    from lac.curator.bayesian import prior_mean
    from lac.curator.ngrams import user_counts
    from lac.suite.data import load_users, prepare_corpora

    t0 = time.perf_counter()
    print("[1/6] data", flush=True)
    emb = glove_default(args.vocab_size)
    corpora = prepare_corpora()
    users = load_users()
    texts = random.SystemRandom().sample(users, min(args.users, len(users)))
    print(f"  embedding {emb.name} ({emb.size} words x {emb.dim} dims); {len(texts)} users' messages "
          f"(BSD fortunes); public corpus {corpora.public_corpus}")

    print("[2/6] keys, TLS material, then curator and shuffler (separate processes, loopback)", flush=True)
    pki = procs.LocalDeployment.create(workdir / "keys")
    analyst = pki.client_tls("analyst")
    curator = procs.start("curator", ["--state-dir", str(workdir / "curator"),
                                      "--public-corpus", str(corpora.public_corpus), *pki.curator_args()],
                          workdir, tls=analyst)
    shuffler = None
    try:
        # One process plays every user, so per-client tokens and quotas would be theatre here.
        shuffler = procs.start("shuffler", ["--state-dir", str(workdir / "shuffler"), "--curator", curator.address,
                                            "--min-batch", str(len(texts)), "--auth", "none", *pki.shuffler_args()],
                               workdir, tls=pki.client_tls())
        print(f"  curator on {curator.address} (mutual TLS), shuffler on {shuffler.address} (TLS; "
              f"min_batch {len(texts)}); reports are HPKE-sealed to curator key {pki.curator_public_key().key_id}")
        print("  WARNING: shuffler runs with --auth none (no client authentication, no per-client quota) "
              "because this one demo process plays all simulated users")

        print(f"[3/6] users privatize locally (multivariate Laplace, ε = {args.local_epsilon:g} per word) "
              "and submit", flush=True)
        localizer = Localizer(emb, MultivariateLaplace(args.local_epsilon))
        bar = Progress("users", len(texts))
        reports, acks = [], []
        with ShufflerClient(shuffler.address, pki.curator_public_key(), pki.client_tls()) as client:
            for i in range(0, len(texts), 100):
                chunk = localizer.privatize_many(texts[i:i + 100])
                reports.extend(chunk)
                acks.extend(client.submit(chunk))
                bar.update(len(chunk))
        bar.close()
        stored = sum(a.status == shuffler_pb2.ACK_STATUS_STORED for a in acks)

        print("[4/6] waiting for the shuffled batch to reach the curator", flush=True)
        with tls.channel(curator.address, analyst) as ch:
            cstub = curator_pb2_grpc.CuratorStub(ch)
            deadline = time.monotonic() + 120
            while (status := cstub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=10)).reports < stored:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"curator holds {status.reports} of {stored} reports after 120s")
                time.sleep(0.2)
            with tls.channel(shuffler.address, pki.client_tls()) as sch:
                sstatus = shuffler_pb2_grpc.ShufflerStub(sch).GetStatus(shuffler_pb2.ShufflerStatusRequest(),
                                                                        timeout=10)

            print(f"[5/6] curator release (BayesianDP, ε = {args.epsilon:g}, δ = {args.delta:g})", flush=True)
            record = cstub.Release(curator_pb2.ReleaseRequest(mechanism="bayesian", epsilon=args.epsilon,
                                                              delta=args.delta, s=args.s, rho=args.rho),
                                   timeout=600)
            release = cstub.GetRelease(curator_pb2.GetReleaseRequest(release_id=record.release_id), timeout=60)
            tops = {n: cstub.TopNgrams(curator_pb2.TopNgramsRequest(release_id=record.release_id, k=args.top,
                                                                    order=n), timeout=30).ngrams
                    for n in range(1, record.max_n + 1)}
    finally:
        if shuffler is not None:
            shuffler.stop()
        curator.stop()

    print("[6/6] comparing with the non-private distributions", flush=True)
    from lac.curator.config import CuratorConfig
    from lac.curator.prior import public_vocabulary

    cc = CuratorConfig()  # the curator above ran with these defaults
    vocab = public_vocabulary(corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items,
                              workdir / "curator" / "prior")
    assert list(vocab.items) == list(release.items), "demo and curator disagree on the release vocabulary"
    log_theta = np.asarray(release.log_probs)
    W = int(record.params["W"])
    C = int(record.params["C"])

    def dist(rows):
        c = np.asarray(user_counts(rows, vocab, C=C, W=W).sum(axis=0)).ravel().astype(float)
        return c / c.sum()

    p_clean = dist([sentences(t) for t in texts])
    p_seen = dist([[list(s) for s in r.sentences] for r in reports])
    mu_p = prior_mean(vocab.alpha)
    log_prior = mu_p - np.logaddexp.reduce(mu_p)

    n_words = np.array([r.n_words for r in reports])
    clean_tokens = [w for t in texts for s in sentences(t) for w in s]
    private_tokens = [w for r in reports for s in r.sentences for w in s]
    changed = np.mean([a != b for a, b in zip(clean_tokens, private_tokens)])
    print()
    print("=" * 72)
    print("LAC demo summary")
    print("=" * 72)
    print(f"reports sent {len(reports)}, stored by shuffler {stored}, duplicates {len(acks) - stored}")
    print(f"batch: {sstatus.reports_forwarded} reports in {sstatus.batches_forwarded} shuffled batch(es); "
          f"curator holds {status.reports}, rejected {sum(status.rejects.values())}")
    print(f"local privacy: {reports[0].mechanism}, ε = {args.local_epsilon:g} per word (metric DP over "
          f"{emb.name}); words per report: median {int(np.median(n_words))}, max {n_words.max()}; "
          f"a report of ℓ words composes to ℓ·ε·d; {100 * changed:.1f}% of words were replaced")
    print(f"release: {record.mechanism}, (ε, δ) = ({record.epsilon:g}, {record.delta:g}), "
          f"sensitivity {record.sensitivity_method}{' (data-dependent)' if record.data_dependent else ''}, "
          f"γ = {record.gamma:.4g}, noise σ = {record.sigma:.4g} ({record.calibration})")
    print(f"  {record.statement}")
    print(f"  vocabulary: {record.vocab_size} public n-grams (n ≤ {record.max_n}), "
          f"params {', '.join(f'{k}={v:g}' for k, v in sorted(record.params.items()))}")
    print("utility (KL in nats, lower is better):")
    print(f"  KL(clean text ‖ release)        = {kl(p_clean, log_theta):.4f}")
    print(f"  KL(perturbed text ‖ release)    = {kl(p_seen, log_theta):.4f}   (the curator's own input)")
    print(f"  KL(clean text ‖ public prior)   = {kl(p_clean, log_prior):.4f}   (public data alone)")
    for n, grams in tops.items():
        print(f"top {n}-grams: " + ", ".join(f"{g.ngram!r} {g.probability:.4f}" for g in grams))
    print(f"finished in {time.perf_counter() - t0:.1f}s")
    return 0
