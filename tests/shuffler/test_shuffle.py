"""The shuffler's privacy randomness: uniform permutations (lac.common.rng's, as lac.shuffler.policy draws
them), Bernoulli sub-sampling, geometric noise."""

import numpy as np
from scipy import stats

from lac.common.rng import secure_generator
from lac.shuffler.policy import Row, select_batch
from lac.shuffler.shuffle import bernoulli_mask, geometric


def secure_permutation(n: int) -> np.ndarray:
    """The shuffler's permutation: a fresh CSPRNG generator's, as select_batch draws it."""
    return secure_generator().permutation(n)


def _position_chi2(shuffle_once, n: int, trials: int) -> float:
    counts = np.zeros((n, n), dtype=int)
    for _ in range(trials):
        counts[shuffle_once(n), np.arange(n)] += 1
    return ((counts - trials / n) ** 2 / (trials / n)).sum()


def test_every_item_lands_in_every_position_uniformly():
    # n items, T shuffles: counts[item, position] ~ T/n each. Chi-square with (n-1)^2 dof;
    # false-alarm rate 1e-4 per check.
    def via_batch(n):  # the batch's keys in shuffled order, as the log then reads their payloads
        rows = [Row(seq=i, client=None, window=0, crowd=None, size=10) for i in range(n)]
        batch = select_batch(rows, threshold=1, max_batch_bytes=20)  # cut into parts: their order concatenated
        return [seq for part in batch.parts for seq in part]

    for shuffle_once in (via_batch, secure_permutation):
        chi2 = _position_chi2(shuffle_once, 6, 12_000)
        assert stats.chi2.sf(chi2, 25) > 1e-4


def test_the_reserve_is_a_uniformly_random_subset_of_the_clients():
    # 6 clients (one with 3 reports), reserve 2: each client is released with probability 4/6 and, when
    # released, by a uniformly random one of its reports. Chi-square on the 8 reports' release counts
    # (7 dof, the per-client totals fixed by the 4 released per draw); false-alarm rate 1e-4.
    clients = [b"a", b"a", b"a", b"b", b"c", b"d", b"e", b"f"]
    rows = [Row(seq=i, client=c, window=0, crowd=None, size=1) for i, c in enumerate(clients)]
    # The statistic is conservative here (a draw's counts are tied together, less spread than multinomial).
    trials = 6_000
    expected = np.array([4 / 6 / 3] * 3 + [4 / 6] * 5) * trials

    def pvalue(select) -> float:
        counts = np.zeros(len(rows))
        for _ in range(trials):
            taken = select()
            assert len(taken) == 4 and len({clients[s] for s in taken}) == 4
            counts[list(taken)] += 1
        return stats.chisquare(counts, expected).pvalue

    def last_of_first_pass():  # broken: keep back the last 2 clients of the one-per-client pass
        seen, taken = set(), []
        for i in secure_permutation(len(rows)).tolist():
            if clients[i] not in seen:
                seen.add(clients[i])
                taken.append(i)
        return taken[:4]

    assert pvalue(lambda: select_batch(rows, threshold=4, reserve=2).taken) > 1e-4
    assert pvalue(last_of_first_pass) < 1e-4  # the audit fails it: client a is released ~93% of the time
    assert select_batch(rows, threshold=5, reserve=2) is None  # 6 clients: 4 after the reserve


def test_all_permutations_equally_likely():
    # 4! = 24 permutations, 24,000 draws: chi-square with 23 dof, false-alarm rate 1e-4.
    index = {}
    counts = np.zeros(24, dtype=int)
    for _ in range(24_000):
        key = tuple(secure_permutation(4))
        counts[index.setdefault(key, len(index))] += 1
    assert len(index) == 24
    assert stats.chisquare(counts).pvalue > 1e-4


def test_large_permutation_is_a_permutation():
    perm = secure_permutation(1_000_000)
    assert np.array_equal(np.sort(perm), np.arange(1_000_000))
    assert secure_permutation(0).size == 0 and list(secure_permutation(1)) == [0]


def test_bernoulli_and_geometric():
    # Binomial and mean tests at a 1e-4 false-alarm rate each.
    n, q = 200_000, 0.3
    assert stats.binomtest(int(bernoulli_mask(n, q).sum()), n, q).pvalue > 1e-4
    assert bernoulli_mask(10, 1.0).all() and not bernoulli_mask(10, 0.0).any()
    mean = 20.0
    draws = np.array([geometric(mean) for _ in range(20_000)])
    p = mean / (1 + mean)
    sd = np.sqrt(p / (1 - p) ** 2 / draws.size)
    assert abs(draws.mean() - mean) < 3.9 * sd and draws.min() >= 0
    assert geometric(0) == 0
