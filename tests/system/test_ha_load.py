"""Issue 35 item 5: no acknowledged report lost or duplicated while every part of a highly available deployment dies
under load. Three ``lac shuffler serve`` replicas over one private PostgreSQL server and two ``lac curator serve``
replicas over another database on it (one shared directory), TLS on every hop (clients → shufflers with bearer
tokens, shufflers → curators mutual TLS, every service → PostgreSQL with ``sslmode=verify-full``), and
``N_CLIENTS`` × ``REPORTS_PER_CLIENT`` = 100,000 HPKE-sealed reports sent concurrently through the SDK with failover
over the three addresses. The shufflers forward to one address that reaches every curator replica (a TCP relay,
``TcpFailover``, standing in for a name or a load balancer: connections go to the first replica that accepts).

During the load, in turn: SIGKILL each shuffler replica and restart it; SIGKILL the lease holder while it has batches
in flight to the curator; SIGKILL the curator replica receiving the batches while it receives one; SIGKILL the other
while an analyst's release runs on it (retried with its request id on the first); ``pg_ctl restart -m immediate``.
After each: every service SERVING again by itself and exactly one shuffler holding the release lease.

At the end (the load drained): the report ids the test sealed into the acknowledged reports are exactly the report
ids the curators stored, once each. The test reads them from the curators' database as an operator with access to
it would; they are the random ids the curator keeps for its replay check, unlinked from any client, so the product
shows nothing it did not before. Every batch the shufflers released was ingested once (released = forwarded =
the curator's batches; no replayed report id, no quarantine, no dead letter); every release request made one
release and the ledger holds exactly their charges."""

from __future__ import annotations

import itertools
import os
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from lac_testkit import (
    DEADLINE,
    PROMPT,
    Pki,
    ServeProc,
    TcpFailover,
    content,
    lease_holders,
    ledger_of,
    postgres_tls,
    shuffler_replica_states,
    wait_until,
)

import lac.client
from lac.client import AckStatus
from lac.client.errors import QuotaExceeded, RetryableError
from lac.common import envelope, tls
from lac.common.database import PostgresDatabase
from lac.common.envelope import CuratorKeyRing
from lac.common.v1 import curator_pb2, curator_pb2_grpc, shuffler_pb2
from lac.shuffler.auth import add_client, add_clients

N_CLIENTS = 2000
REPORTS_PER_CLIENT = 50  # the quota k of the deployment (both services), so every client may send them all
PER_CALL = 10  # reports per Submit: a client sends its reports in 5 calls, interleaved with the other clients'
MIN_BATCH = 100  # ~10^3 batches of 100 or more distinct clients' reports
SENDERS = 12  # load threads, each an app's SDK over the three addresses
RATE = 700.0  # reports per second at most: the load lasts ~150 s, and every event below happens during it
TEXTS = (["the", "dog", "sleeps"], ["a", "fox", "is", "small"], ["we", "walk"])  # tiny: the smallest sealed size


class Load:
    """The clients' reports and their fate: work items (client, its sealed reports), sent by ``SENDERS`` threads
    through the SDK; an item the SDK gave up on (RetryableError after its own rounds of retries) goes back to the
    queue and is sent again with the same idempotency ids and bytes."""

    def __init__(self, addresses: list[str], tokens: dict[str, str], key, client_tls):
        self.addresses, self.tokens, self.key, self.tls = addresses, tokens, key, client_tls
        self.work: queue.Queue = queue.Queue()
        for _ in range(REPORTS_PER_CLIENT // PER_CALL):  # round by round: many distinct clients buffered at once
            for client in tokens:
                self.work.put((client, None))
        self.acked: set[bytes] = set()  # report ids of acknowledged reports
        self.made = 0
        self.started = time.monotonic()
        self.resent = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _seal(self, n: int) -> tuple[list[bytes], list[shuffler_pb2.ClientReport]]:
        ids, reports = [], []
        for _ in range(n):
            c = content(random.choice(TEXTS))
            ids.append(c.report_id)
            reports.append(shuffler_pb2.ClientReport(idempotency_id=os.urandom(16), payload=envelope.seal(c, self.key)))
        return ids, reports

    def send(self, client: str, n: int) -> None:
        """``n`` new reports of ``client``, sent until acknowledged (for the fillers at the end)."""
        self.work.put((client, self._seal(n)))

    def sender(self) -> None:
        sdk = lac.client.ShufflerClient(
            self.addresses, self.key, self.tls, attempts=3, timeout=DEADLINE, connect_timeout=5
        )
        try:
            while not self.stop.is_set():
                try:
                    client, sealed = self.work.get(timeout=0.2)
                except queue.Empty:
                    continue
                ids, reports = sealed or self._seal(PER_CALL)
                if sealed is None:  # a new call: at RATE
                    with self.lock:
                        self.made += len(ids)
                        due = self.started + self.made / RATE
                    time.sleep(max(0.0, due - time.monotonic()))
                try:
                    acks = sdk.submit_prepared(reports, token=self.tokens[client])
                except QuotaExceeded as exc:  # a retry would never end: the quota holds until the next window
                    with self.lock:
                        self.errors.append(f"{client}: {exc}")
                    continue
                except RetryableError:
                    with self.lock:
                        self.resent += 1
                    self.work.put((client, (ids, reports)))
                    continue
                except Exception as exc:  # any other answer is a failure of the run
                    with self.lock:
                        self.errors.append(f"{client}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    self.work.task_done()
                bad = [a.status for a in acks if a.status not in (AckStatus.STORED, AckStatus.DUPLICATE)]
                with self.lock:
                    if bad or len(acks) != len(ids):
                        self.errors.append(f"{client}: acks {bad} for {len(ids)} reports")
                    else:
                        self.acked.update(ids)
        finally:
            sdk.close()


def _curator_args(tmp_path, name: str, url: str, corpus, key_dir, pki: Pki) -> list[str]:
    cert, key = pki.pem("curator")
    return [
        "--state-dir", str(tmp_path / name), "--shared-dir", str(tmp_path / "shared"), "--store", url,
        "--public-corpus", str(corpus), "--vocab-min-count", "1", "--no-clean-estimate", "--min-signal-share", "0",
        "--min-free-disk-bytes", "0", "--ingest-workers", "1", "--budget-epsilon", "1000000",
        "--reports-per-window", str(REPORTS_PER_CLIENT),
        "--key-dir", str(key_dir), "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki.ca,
    ]  # fmt: skip


def _shuffler_args(state, url: str, curator: str, pki: Pki) -> list[str]:
    cert, key = pki.pem("shuffler")
    return [
        "--state-dir", str(state), "--store", url, "--curator", curator, "--min-batch", str(MIN_BATCH),
        "--release-interval-seconds", "1", "--forward-retry-max-seconds", "0.5",
        "--reports-per-window", str(REPORTS_PER_CLIENT), "--min-free-disk-bytes", "0",
        "--tls-cert", cert, "--tls-key", key, "--curator-ca", pki.ca,
    ]  # fmt: skip


class Services:
    """The five processes by name ("s0".."s2", "ca", "cb"), each restarted on its own port after a kill."""

    def __init__(self) -> None:
        self.procs: dict[str, ServeProc] = {}
        self.made: dict[str, tuple] = {}

    def start(self, name: str, args: list[str], workdir, service: str, client_tls, port: int = 0) -> ServeProc:
        self.made[name] = (args, workdir, service, client_tls)
        self.procs[name] = ServeProc(args, workdir, timeout=120, service=service, tls=client_tls, port=port)
        return self.procs[name]

    def restart(self, name: str) -> float:
        """Start ``name`` again on its port (after a kill); the seconds until it serves."""
        t0 = time.monotonic()
        args, workdir, service, client_tls = self.made[name]
        port = self.procs[name].port
        self.procs[name] = ServeProc(args, workdir, timeout=120, service=service, tls=client_tls, port=port)
        return time.monotonic() - t0

    def kill_and_restart(self, name: str) -> float:
        """SIGKILL ``name`` and start it again; the seconds until it serves again."""
        t0 = time.monotonic()
        self.procs[name].kill()
        self.restart(name)
        return time.monotonic() - t0

    def all_serving(self) -> bool:
        return all(p.health() == "SERVING" for p in self.procs.values())

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nothing_acknowledged_is_lost_or_duplicated_while_every_part_dies(
    tmp_path, own_postgres_cluster, public_corpus, curator_key_dir
):
    t_start = time.monotonic()
    pki = Pki(tmp_path / "pki")
    tls_query = postgres_tls(own_postgres_cluster, pki)
    shuffler_url = own_postgres_cluster.create_database("shuffler") + tls_query
    curator_url = own_postgres_cluster.create_database("curator") + tls_query
    tokens_file = tmp_path / "clients.tokens"
    ids = [f"c{i:04d}" for i in range(N_CLIENTS + MIN_BATCH)]  # the last MIN_BATCH are the fillers of the drain
    tokens = dict(zip(ids, add_clients(tokens_file, ids)))
    ops = [("authorization", f"Bearer {add_client(tokens_file, 'ops', role='operator')}")]
    clients_tls, operator_tls, analyst_tls = pki.client_tls(), pki.client_tls("operator"), pki.client_tls("analyst")
    key = CuratorKeyRing.load(curator_key_dir).public_key()
    events: list[str] = []

    def note(what: str) -> None:
        events.append(f"{time.monotonic() - t_start:6.1f} s, load {os.getloadavg()[0]:.1f}: {what}")
        print(events[-1], flush=True)

    services = Services()
    relay = load = None
    pool = ThreadPoolExecutor(SENDERS)
    try:
        for name in ("ca", "cb"):
            args = _curator_args(tmp_path, name, curator_url, public_corpus, curator_key_dir, pki)
            services.start(name, args, tmp_path / f"proc-{name}", "curator", operator_tls)
        ca, cb = (services.procs[n].address for n in ("ca", "cb"))
        relay = TcpFailover([ca, cb])
        for i, state in enumerate(shuffler_replica_states(tmp_path, 3, tokens_file)):
            args = _shuffler_args(state, shuffler_url, relay.address, pki)
            services.start(f"s{i}", args, tmp_path / f"proc-s{i}", "shuffler", clients_tls)
        shufflers = [services.procs[f"s{i}"].address for i in range(3)]
        note("3 shufflers and 2 curators serving")

        def holder(dead: str = "") -> str:
            """The one shuffler holding the release lease (waited for), ``dead`` left out."""
            alive = [a for i, a in enumerate(shufflers) if f"s{i}" != dead]
            wait_until(lambda: len(lease_holders(alive, ops, clients_tls)) == 1, timeout=DEADLINE)
            (address,) = lease_holders(alive, ops, clients_tls)
            return f"s{shufflers.index(address)}"

        def shuffler_status(name: str) -> shuffler_pb2.ShufflerStatus:
            from lac.common.v1 import shuffler_pb2_grpc

            with tls.channel(services.procs[name].address, clients_tls) as ch:
                return shuffler_pb2_grpc.ShufflerStub(ch).GetStatus(
                    shuffler_pb2.ShufflerStatusRequest(), metadata=ops, timeout=DEADLINE
                )

        def recovered(what: str) -> str:
            """After an event: every service SERVING by itself, one lease holder (returned)."""
            wait_until(services.all_serving, timeout=2 * DEADLINE)
            now = holder()
            note(f"{what}; all SERVING again, lease on {now}")
            return now

        def lease_sessions() -> set[int]:
            """The PostgreSQL backends holding an advisory lock on the shufflers' database (the release lease)."""
            db = PostgresDatabase(shuffler_url)
            try:
                rows = db.execute(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                ).fetchall()
            finally:
                db.close()
            return {int(r[0]) for r in rows}

        requests: list[str] = []  # every release request id sent

        def release(name: str, rid: str, timeout: float = DEADLINE) -> curator_pb2.ReleaseRecord:
            if rid not in requests:
                requests.append(rid)
            with tls.channel(services.procs[name].address, analyst_tls) as ch:
                request = curator_pb2.ReleaseRequest(epsilon=0.01, delta=1e-8, force=True, request_id=rid)
                return curator_pb2_grpc.CuratorStub(ch).Release(request, timeout=timeout)

        load = Load(shufflers, {c: tokens[c] for c in ids[:N_CLIENTS]}, key, clients_tls)
        senders = [pool.submit(load.sender) for _ in range(SENDERS)]

        def at(share: float) -> None:
            """Wait until ``share`` of the reports are acknowledged."""
            goal = share * N_CLIENTS * REPORTS_PER_CLIENT
            try:
                wait_until(lambda: len(load.acked) >= goal or load.errors, 4 * DEADLINE)
            finally:
                for f in senders:
                    if f.done():
                        f.result()  # a sender that failed: its exception
                assert not load.errors, load.errors[:5]
            during.append(len(load.acked))
            note(f"{len(load.acked):,} reports acknowledged ({load.resent} calls sent again)")

        during: list[int] = []  # reports acknowledged when each event began
        lease = holder()
        for i in range(3):  # each shuffler replica in turn
            at(0.05 + 0.08 * i)
            held = lease == f"s{i}"
            took = services.kill_and_restart(f"s{i}")
            lease = recovered(f"SIGKILL s{i} ({'the' if held else 'not the'} lease holder), restarted in {took:.1f} s")

        at(0.3)  # the lease holder, while it has batches released and not yet acknowledged by the curator
        wait_until(lambda: shuffler_status(lease).batches_pending > 0, timeout=DEADLINE)
        sessions = lease_sessions()
        killed_at = time.monotonic()
        services.procs[lease].kill()
        wait_until(lambda: lease_sessions() - sessions, timeout=DEADLINE)  # a new session holds the lease
        passed = time.monotonic() - killed_at
        assert passed < PROMPT, f"the lease passed {passed:.1f} s after the holder's SIGKILL"
        new = holder(dead=lease)
        services.restart(lease)
        lease = recovered(f"SIGKILL lease holder {lease} mid-release; the lease passed to {new} after {passed:.1f} s")

        at(0.38)
        release("ca", "release-before")  # a release made normally, for the ledger
        at(0.4)  # curator a, mid-ingest: it is sent a batch now
        wait_until(lambda: time.monotonic() - relay.last_sent[ca] < 0.1, timeout=DEADLINE)
        before_b = relay.sent[cb]
        services.procs["ca"].kill()
        # cb is sent the batches while ca is down (waited for before ca starts again: restarted at once, ca could be
        # back before the shuffler's next batch, and then nothing would need cb)
        wait_until(lambda: relay.sent[cb] > before_b, DEADLINE)
        took = services.restart("ca")
        recovered(f"SIGKILL curator ca mid-ingest (cb took the batches), restarted in {took:.1f} s")

        at(0.5)  # curator b, mid-release: the analyst's call is cut off and retried with its request id on a
        cut = 0
        for attempt in range(5):
            rid = f"release-cut-{attempt}"
            got: list = []
            call = threading.Thread(target=lambda r=rid: got.append(_try(release, "cb", r)))
            call.start()
            time.sleep(random.uniform(0.3, 1.0))
            took = services.kill_and_restart("cb")
            call.join(DEADLINE)
            if got and isinstance(got[0], grpc.RpcError):
                cut += 1
                record = release("ca", rid)  # the retry on the other replica
                note(f"release {rid} cut off by the kill; its retry on ca gave {record.release_id}")
                break
            note(f"release {rid} answered before the kill; again")
        assert cut == 1, "no release was cut off by a curator's kill in 5 tries"
        recovered(f"SIGKILL curator cb mid-release, restarted in {took:.1f} s")
        with tls.channel(ca, operator_tls) as ch:  # the ledger exact after the kills
            stub = curator_pb2_grpc.CuratorStub(ch)
            records = stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=DEADLINE).releases
            budget = stub.GetBudget(curator_pb2.BudgetRequest(), timeout=DEADLINE)
        assert {w.window: w.spent_epsilon for w in budget.windows if w.spent_epsilon} == pytest.approx(
            ledger_of(records), rel=1e-9, abs=1e-12
        )

        at(0.6)
        t0 = time.monotonic()
        own_postgres_cluster.restart("immediate")
        recovered(f"pg_ctl restart -m immediate ({time.monotonic() - t0:.1f} s)")

        total = N_CLIENTS * REPORTS_PER_CLIENT
        assert max(during) < total, f"an event came after the load: acknowledged when each began {during}"
        load.work.join()  # every item acknowledged
        assert not load.errors, load.errors[:5]
        note(f"all {len(load.acked):,} reports acknowledged ({load.resent} calls sent again after the SDK gave up)")
        fillers = itertools.cycle(ids[N_CLIENTS:])  # 100 clients with a quota of 50: 5,000 reports at most
        load.tokens.update({c: tokens[c] for c in ids[N_CLIENTS:]})
        deadline = time.monotonic() + 4 * DEADLINE
        while True:  # drain: reports of fewer than MIN_BATCH clients wait for more clients' reports
            status = shuffler_status(holder())
            if status.buffered_reports == 0 and status.batches_pending == 0:
                break
            assert time.monotonic() < deadline, f"not drained: {status}"
            if status.buffered_reports and not status.batches_pending and status.buffered_clients < MIN_BATCH:
                for _ in range(MIN_BATCH - status.buffered_clients):
                    load.send(next(fillers), 1)
                load.work.join()
                assert not load.errors, load.errors[:5]
            time.sleep(1)
        note(f"drained: {len(load.acked):,} reports acknowledged in all")
        load.stop.set()
        for f in senders:
            f.result()
        release("ca", "release-after")
        for rid in requests:  # every request id again, on either replica: the same release, nothing charged twice
            release(random.choice(["ca", "cb"]), rid)

        with tls.channel(cb, operator_tls) as ch:
            stub = curator_pb2_grpc.CuratorStub(ch)
            cur = stub.GetStatus(curator_pb2.CuratorStatusRequest(), timeout=DEADLINE)
            records = stub.ListReleases(curator_pb2.ListReleasesRequest(), timeout=DEADLINE).releases
            spent = {
                w.window: w.spent_epsilon for w in stub.GetBudget(curator_pb2.BudgetRequest(), timeout=DEADLINE).windows
            }
        shf = shuffler_status(holder())
        assert services.all_serving()
    finally:
        if load is not None:
            load.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        services.stop()
        if relay is not None:
            relay.stop()

    db = PostgresDatabase(curator_url)
    try:
        stored = [bytes(r[0]) for r in db.execute("SELECT report_id FROM report_ids").fetchall()]
        (batches,) = db.execute("SELECT COUNT(*) FROM batches").fetchone()
    finally:
        db.close()
    assert len(stored) == len(set(stored)) == cur.reports, "a report was stored twice"
    lost, foreign = load.acked - set(stored), set(stored) - load.acked
    assert not lost and not foreign, f"{len(lost)} acknowledged reports lost; {len(foreign)} stored never acknowledged"
    assert cur.quarantined == 0 and not dict(cur.rejects), dict(cur.rejects)  # no replayed id: no batch twice
    counters = dict(shf.counters)
    assert counters["batches_released"] == counters["batches_forwarded"] == batches == cur.batches
    assert counters["reports_forwarded"] == counters["accepted"] == len(load.acked)
    assert shf.batches_dead_letter == 0
    assert sorted(r.request_id for r in records) == sorted(requests), "a request made 0 or 2 releases"
    assert {w: e for w, e in spent.items() if e} == pytest.approx(ledger_of(records), rel=1e-9, abs=1e-12)
    note(
        f"done: {len(load.acked):,} acknowledged = stored once; {batches} batches; {len(records)} releases, "
        f"ledger exact; {load.resent} calls sent again"
    )


def _try(call, *args):
    try:
        return call(*args)
    except grpc.RpcError as exc:
        return exc
