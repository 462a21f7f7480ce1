"""``lac demo``: the whole pipeline on this machine, with real data and real processes.

Curator and shuffler run as separate processes on loopback with production settings (TLS,
mTLS between the services, HPKE-sealed reports, one bearer token per simulated user, the
curator's published deployment enforced by the SDK); simulated users (BSD fortunes) privatize
their text and submit it; the shuffler releases one shuffled batch of distinct clients; the
curator releases the n-gram distribution with the sound (data-independent) BayesianDP; the
summary prints the one end-to-end privacy statement and compares the release with the
non-private distributions.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from lac.analyst import CuratorClient
from lac.common import tls
from lac.common.paths import data_dir
from lac.common.progress import Progress
from lac.common.text import sentences
from lac.common.v1 import curator_pb2, shuffler_pb2, shuffler_pb2_grpc
from lac.suite import procs

CHANNEL_TIMEOUT = 1800.0  # the demo waits this long at most for the curator's local channel (sampled once)


def register(subparsers) -> None:
    """Add ``lac demo`` (curator, shuffler and simulated users end to end) to the ``lac`` command."""
    p = subparsers.add_parser(
        "demo",
        help="run curator + shuffler + simulated users end to end",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--users", type=int, default=12_327, help="simulated users, one report each (at most 12,327)")
    p.add_argument(
        "--local-epsilon", type=float, default=8.0, help="client metric-DP ε per word (8: the SDK's 'balanced' preset)"
    )
    p.add_argument("--vocab-size", type=int, default=20_000, help="embedding vocabulary (most frequent words)")
    p.add_argument("--epsilon", type=float, default=1.0, help="curator release ε")
    p.add_argument("--delta", type=float, default=1e-6, help="curator release δ")
    p.add_argument(
        "--max-report-words",
        type=int,
        default=40,
        help="L: the deployment's most words per report (longer messages are truncated)",
    )
    p.add_argument("--top", type=int, default=10, help="n-grams to show per order")
    p.add_argument("--workdir", type=Path, default=None, help="keep state and logs here (default: a temp dir)")
    p.set_defaults(func=run)


def run(args) -> int:
    """``lac demo``: run in ``--workdir``, or in a temporary directory removed afterwards; the exit status."""
    if args.workdir is None:
        with tempfile.TemporaryDirectory(prefix="lac-demo-") as tmp:
            return _run(args, Path(tmp))
    return _run(args, args.workdir)


def _run(args, workdir: Path) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from lac.client.acks import AckStatus
    from lac.client.embedding import glove_default
    from lac.client.localizer import Localizer
    from lac.client.mechanisms import MultivariateLaplace
    from lac.client.submit import ShufflerClient
    from lac.curator.base.ngrams import report_items
    from lac.curator.lm.model import NgramModel, release_model
    from lac.curator.release.building import vocab_counts
    from lac.shuffler.auth import add_clients
    from lac.suite.data import load_users, prepare_corpora

    t0 = time.perf_counter()
    print("[1/6] data", flush=True)
    emb = glove_default(args.vocab_size)
    corpora = prepare_corpora()
    users = load_users()
    texts = random.SystemRandom().sample(users, min(args.users, len(users)))
    print(
        f"  embedding {emb.name} ({emb.size} words x {emb.dim} dims, diameter {emb.diameter():.4g}); "
        f"{len(texts)} users' messages (BSD fortunes); public corpus {corpora.public_corpus}"
    )

    print("[2/6] keys, TLS material, then curator and shuffler (separate processes, loopback)", flush=True)
    pki = procs.LocalDeployment.create(workdir / "keys")
    analyst = pki.client_tls("analyst")
    tokens = add_clients(workdir / "shuffler" / "clients.tokens", [f"user-{i}" for i in range(len(texts))])
    (operator_token,) = add_clients(workdir / "shuffler" / "clients.tokens", ["demo-operator"], role="operator")
    published = [
        "--embedding",
        emb.name,
        "--word-distance-bound",
        repr(emb.diameter()),
        "--epsilon-per-word",
        repr(args.local_epsilon),
        "--max-report-words",
        str(args.max_report_words),
    ]
    curator = procs.start(
        "curator",
        [
            "--state-dir",
            str(workdir / "curator"),
            "--public-corpus",
            str(corpora.public_corpus),
            "--channel-cache-dir",
            str(data_dir() / "channels"),  # the local channel is public: sampled once per deployment, kept
            *published,
            *pki.curator_args(),
        ],
        workdir,
        tls=analyst,
    )
    shuffler = None
    try:
        shuffler = procs.start(
            "shuffler",
            [
                "--state-dir",
                str(workdir / "shuffler"),
                "--curator",
                curator.address,
                "--min-batch",
                str(len(texts)),
                *pki.shuffler_args(),
            ],
            workdir,
            tls=pki.client_tls(),
        )
        print(
            f"  curator on {curator.address} (mutual TLS), shuffler on {shuffler.address} (TLS; one bearer token "
            f"per user, quota 1 report per day; min_batch {len(texts)}); reports are HPKE-sealed to curator key "
            f"{pki.curator_public_key().key_id}"
        )

        with ShufflerClient(shuffler.address, pki.curator_public_key(), pki.client_tls(), token=tokens[0]) as client:
            deployment = client.deployment()
            print(
                f"[3/6] users privatize locally with the deployment the curator publishes (multivariate Laplace, "
                f"ε = {deployment.epsilon_per_word:g} per word, at most {deployment.max_report_words} words per "
                f"report) and submit, each with its own token",
                flush=True,
            )
            localizer = Localizer(emb, MultivariateLaplace(deployment.epsilon_per_word), deployment=deployment)
            reports = localizer.privatize_many(texts)
            bar = Progress("users", len(texts))

            def submit(i):
                acks = client.submit([reports[i]], token=tokens[i])
                bar.update()
                return acks

            with ThreadPoolExecutor(8) as pool:
                acks = [a for chunk in pool.map(submit, range(len(reports))) for a in chunk]
            bar.close()
        stored = sum(a.status == AckStatus.STORED for a in acks)

        print("[4/6] waiting for the shuffled batch to reach the curator", flush=True)
        with CuratorClient.with_tls(curator.address, pki.client_tls("operator"), timeout=10) as ops:
            deadline = time.monotonic() + 120
            while (status := ops.status()).reports < stored:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"curator holds {status.reports} of {stored} reports after 120s")
                time.sleep(0.2)
        with tls.channel(shuffler.address, pki.client_tls()) as sch:
            sstatus = shuffler_pb2_grpc.ShufflerStub(sch).GetStatus(
                shuffler_pb2.ShufflerStatusRequest(),
                timeout=10,
                metadata=(("authorization", f"Bearer {operator_token}"),),
            )

        print(
            f"[5/6] curator release as an analyst (default mechanism, sound sensitivity, ε = {args.epsilon:g}, "
            f"δ = {args.delta:g})",
            flush=True,
        )
        procs.ChannelWatch(curator.address, analyst).wait(CHANNEL_TIMEOUT)  # progress lines until it is ready
        with CuratorClient.with_tls(curator.address, analyst) as c:
            # the demo knows how many reports it sent: it may assume that number (an analyst's own knowledge)
            preview = c.preview(args.epsilon, args.delta, expected_reports=len(reports))  # free: nothing is spent
            print(f"      accuracy preview: {preview.statement}", flush=True)
            # the demo shows its release whatever the preview says (and says so below); the record as the curator
            # sent it (its discovery numbers, which ReleaseInfo does not keep)
            request = curator_pb2.ReleaseRequest(
                epsilon=args.epsilon, delta=args.delta, expected_reports=len(reports), force=True
            )
            record = c.send_release(request)
            release = c.call("GetRelease", curator_pb2.GetReleaseRequest(release_id=record.release_id))
            tops = {
                n: c.call(
                    "TopNgrams", curator_pb2.TopNgramsRequest(release_id=record.release_id, k=args.top, order=n)
                ).ngrams
                for n in range(1, record.max_n + 1)
            }
    finally:
        if shuffler is not None:
            shuffler.stop()
        curator.stop()

    print("[6/6] comparing with the non-private distributions", flush=True)
    from lac.curator.base.prior import public_vocabulary
    from lac.curator.service.config import CuratorConfig

    cc = CuratorConfig()  # the curator above ran with these release defaults
    vocab = public_vocabulary(
        corpora.public_corpus, cc.max_n, cc.vocab_min_count, cc.vocab_max_items, workdir / "curator" / "prior"
    )
    assert list(release.items[: len(vocab)]) == list(vocab.items), "demo and curator disagree on the release vocabulary"

    release_lm = release_model(
        list(release.items),
        np.asarray(release.log_probs),
        np.asarray(release.pseudo_counts) if release.pseudo_counts else None,
        record.max_n,
    )
    prior_lm = release_model(vocab.items, None, vocab.alpha, cc.max_n)
    clean = [s for t in texts for s in sentences(t)]
    seen = [[list(s) for s in r.sentences] for r in reports]
    batch = sstatus.recent_batches[0].privacy if sstatus.recent_batches else None
    # what an exact, non-private count of the same reports would give (the demo simulates the users, so it can)
    caps = (cc.item_clamp, cc.max_items_per_report)
    exact_clean = vocab_counts(iter([report_items([sentences(t) for t in texts], cc.max_n, vocab.words)]), vocab, *caps)
    exact_seen = vocab_counts(iter([report_items(seen, cc.max_n, vocab.words)]), vocab, *caps)

    def exact_lm(U) -> NgramModel:
        return release_model(vocab.items, None, np.asarray(U.sum(axis=0)).ravel(), cc.max_n)

    n_words = np.array([r.n_words for r in reports])
    # word by word within each report (a truncated report keeps its first L words)
    pairs = [
        (a, b)
        for t, r in zip(texts, reports)
        for a, b in zip([w for s in sentences(t) for w in s], [w for s in r.sentences for w in s])
    ]
    changed = np.mean([a != b for a, b in pairs])
    ppl_release, ppl_prior = release_lm.perplexity(clean), prior_lm.perplexity(clean)
    ppl_clean, ppl_seen = exact_lm(exact_clean).perplexity(clean), exact_lm(exact_seen).perplexity(clean)
    print()
    print("=" * 72)
    print("LAC demo summary")
    print("=" * 72)
    print(f"reports sent {len(reports)}, stored by shuffler {stored}, duplicates {len(acks) - stored}")
    print(
        f"batch: {sstatus.reports_forwarded} reports in {sstatus.batches_forwarded} shuffled batch(es); "
        f"curator holds {status.reports}, rejected {sum(status.rejects.values())}"
    )
    print(
        f"words per report: median {int(np.median(n_words))}, max {n_words.max()} (L = "
        f"{deployment.max_report_words}); {100 * changed:.1f}% of words were replaced"
    )
    print()
    print("The end-to-end privacy statement, one layer at a time:")
    print(f"  1. each word (on the device): {deployment.word_guarantee().statement()}")
    print(f"  2. each report (on the device): {deployment.report_guarantee().statement()}")
    print(f"  3. the shuffled batch (shuffler): {batch.statement if batch else 'no batch statement'}")
    print(f"  4. the release (curator, what the analyst holds): {record.statement}")
    print()
    print(
        f"release: {record.mechanism}, noise σ = {record.sigma:.4g} ({record.calibration} calibration), "
        f"{record.vocab_size} n-grams (n ≤ {record.max_n}) of which {record.discovered} discovered above "
        f"ρ = {record.discovery_threshold:.4g}; params "
        f"{', '.join(f'{k}={v:g}' for k, v in sorted(record.params.items()))}"
    )
    aware = record.params.get("channel", 0.0) > 0
    print(
        "utility, end to end: perplexity of a trigram language model on the users' CLEAN text (lower is better; "
        "the same estimator everywhere):"
    )
    print(f"  public prior alone                                         = {ppl_prior:.1f}")
    what = "channel-aware: the clean text estimated" if aware else "no local channel: the perturbed text"
    print(f"  the release ({what}){' ' * max(0, 31 - len(what))} = {ppl_release:.1f}")
    print(f"  exact counts of the perturbed reports (non-private)        = {ppl_seen:.1f}")
    print(f"  exact counts of the clean texts (non-private; the ceiling) = {ppl_clean:.1f}")
    swamped = bool(preview.swamped)
    if swamped:
        print(
            "  The accuracy preview predicted that the curator's noise would swamp the signal at this size (the "
            "demo forced the release)."
        )
    gain = ppl_prior - ppl_release
    if gain > 0:
        room = ppl_prior - ppl_clean
        share = (
            f"{100 * gain / room:.0f}% of the way from the public prior to the clean text's own counts"
            if room > 0
            else ""
        )
        print(
            f"  The release models the users' clean text {ppl_prior / ppl_release:.2f}x better than the public prior "
            f"(perplexity ratio){': ' + share if share else ''}, after local perturbation ({100 * changed:.0f}% of "
            f"the words replaced), shuffling and curator noise."
        )
        if aware and ppl_seen >= ppl_release:
            print(
                f"  Without the channel-aware estimate even exact counts of the perturbed reports ({ppl_seen:.1f}) "
                f"would do worse: the devices' noise is undone by the curator, from public knowledge only."
            )
    else:
        why = (
            f"the curator's noise (σ = {record.sigma:.3g}) hides the users' own statistics"
            if swamped
            else f"the devices replaced {100 * changed:.0f}% of the words"
            + ("" if aware else " and this curator has no local channel to estimate the clean text from them")
        )
        print(
            f"  At this size ({len(texts)} users) the release adds nothing over the public prior on the users' clean "
            f"text: {why}. More users or a larger ε per word (the 'utility' preset) would help."
        )
    for n, grams in tops.items():
        print(f"top {n}-grams: " + ", ".join(f"{g.ngram!r} {g.probability:.4f}" for g in grams))
    print(f"finished in {time.perf_counter() - t0:.1f}s")
    return 0
