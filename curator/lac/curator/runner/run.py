"""One release run and what the curator keeps of it.

* ``run``: reports + public vocabulary + spec + caps + privacy unit -> ``Release`` (the released
  items, log-probabilities and pseudo-counts, and the typed ``Guarantee`` its statement is
  rendered from), by the spec's mechanism from the registry (``lac.curator.mechanisms``).
* ``ReleaseRecord``: what the curator remembers of a release, with the statements an analyst and an
  operator read (its guarantee, then what its error bars cover).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import scipy.sparse as sp

from lac.common.privacy import ErrorBars, ExportedWindows, PeriodLoss, PrivacyUnit
from lac.common.rng import RandomSource
from lac.curator import mechanisms
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.engines.local import LOCAL, Engine
from lac.curator.mechanisms import ReleaseSpec
from lac.curator.release.building import MatrixReports, PublicCaps, Release, ReleaseInputs, Reports
from lac.curator.release.channel import NgramChannel
from lac.curator.release.errorbars import Bootstrap

__all__ = ["run", "ReleaseRecord"]


def run(
    reports: Reports | sp.csr_matrix,
    vocab: NgramVocabulary,
    spec: ReleaseSpec,
    caps: PublicCaps,
    unit: PrivacyUnit = PrivacyUnit.report(),
    rng: RandomSource | None = None,
    engine: Engine = LOCAL,
    channel: NgramChannel | None = None,
    errors: Bootstrap | None = None,
) -> Release:
    """Run ``spec`` on ``reports`` (a ``Reports`` source, or a per-report counts matrix over ``vocab``).

    The mechanism (``lac.curator.mechanisms``) runs it: stored and in-memory reports are streamed
    through ``engine`` (``lac.curator.engines.local``): every mechanism but EndToEndDP and k-anonymity
    reads them block by block; an offline matrix is used as given. With the deployment's local
    ``channel``, the default mechanism estimates the users' clean statistics (post-processing,
    ``lac.curator.release.posterior.clean_estimate``). With ``errors`` (how to bootstrap), the release carries its
    per-item error bars (``lac.curator.release.errorbars``): the curator's releases always do; an evaluation's
    many releases need not. The release carries the charge of the mechanism's privacy map
    (``lac.curator.mechanisms.release``)."""
    if sp.issparse(reports):
        reports = MatrixReports(sp.csr_matrix(reports), vocab)
    inputs = ReleaseInputs(reports, vocab, caps, unit, rng, engine, channel, errors)
    return mechanisms.release(spec, inputs)


def _data_dependent_caveat(n: int) -> str:
    """What a DP release's statement adds when its windows had ``n`` data-dependent releases before it."""
    if not n:
        return ""
    return (
        f" Caveat: the data of its windows also fed up to {n} data-dependent release(s) (NOT differentially "
        f"private, enabled by the operator), so the privacy loss of those windows' clients is not bounded by "
        f"the ledger's ε and δ alone."
    )


def _perturbed_text_note(mechanism: str) -> str:
    """What a release that used no local channel describes (``Release.channel`` empty)."""
    why = (
        "no local channel was available: clean_estimate is off or lac-curator[channel] is not installed"
        if "channel" in mechanisms.get(mechanism).knobs
        else f"{mechanism} does not estimate it; the default release does, with the deployment's local channel"
    )
    return f" It describes the text of the reports as the devices perturbed it, not the users' clean text ({why})."


@dataclass(frozen=True)
class ReleaseRecord:
    """What the curator remembers of a release (stored as JSON; ``lac.curator.service.serde`` renders the
    analyst's and the operator's views of it)."""

    release_id: str
    created_at: str
    mechanism: str
    params: dict[str, float]
    sensitivity_method: str
    data_dependent: bool
    differentially_private: bool
    gamma: float
    sigma: float
    calibration: str
    laplace_scale: float
    epsilon: float
    delta: float
    charged_epsilon: float  # spent from each covered window (0 when not DP)
    charged_delta: float
    n_reports: int  # exact: operator only
    vocab_size: int
    max_n: int
    first_window: int
    last_window: int
    privacy_unit: str
    reports_per_user: int
    statement: str  # the full statement (operator)
    public_statement: str  # the statement without data-derived numbers (analyst)
    threshold: float = 0.0  # the discovery threshold ρ (posterior)
    discovered: int = 0  # n-grams released by DP discovery
    request_id: str = ""  # the client's id of the request that made it (idempotent retries)
    channel: str = ""  # the deployment whose local channel estimated the users' clean text ("": the perturbed text)
    data_dependent_before: int = 0  # data-dependent (NOT DP) releases that had covered one of its windows before it
    exported_windows: int = 0  # of its windows, those whose privatized reports were exported before it (DP releases)
    error_bars: dict = field(default_factory=dict)  # ``ErrorBars.to_dict()`` of its error bars ({}: made without)

    @classmethod
    def of(
        cls,
        release: Release,
        release_id: str,
        created_at: str,
        max_n: int,
        windows: tuple[int, int],
        unit: PrivacyUnit,
        request_id: str = "",
        data_dependent_before: int = 0,
        period: PeriodLoss | None = None,
        exported: ExportedWindows | None = None,
        preface: str = "",
    ) -> ReleaseRecord:
        """The record of ``release``; ``data_dependent_before``: the most data-dependent releases any of
        its windows had before it (a DP release's statements then say its guarantee is not the whole story);
        ``period``: one client's loss over a period, which its statements end with; ``exported``: its windows whose
        privatized reports were exported before it (a DP release's statements say how the two compose);
        ``preface``: what its statements say first (what the numbers describe, when not what a reader would
        assume)."""
        g = release.guarantee
        charge = release.charge
        dp = release.differentially_private
        caveat = _data_dependent_caveat(data_dependent_before) if dp else ""
        if exported is not None and dp:
            caveat += " " + exported.caveat()
        if not release.channel:
            caveat += _perturbed_text_note(release.mechanism)
        if period is not None and release.differentially_private:  # the bound composes DP releases only
            caveat += " " + period.statement()
        bars = release.errors.bars if release.errors is not None else None
        if bars is not None:
            caveat = " " + bars.statement() + caveat
        return cls(
            release_id=release_id,
            created_at=created_at,
            mechanism=release.mechanism,
            params=dict(release.params),
            sensitivity_method=release.sensitivity_method,
            data_dependent=g is None or g.data_dependent,
            differentially_private=release.differentially_private,
            gamma=release.gamma,
            sigma=release.sigma,
            calibration=release.calibration,
            laplace_scale=release.laplace_scale,
            epsilon=g.epsilon if g else float("inf"),
            delta=g.delta if g else 0.0,
            charged_epsilon=charge.epsilon if charge else 0.0,
            charged_delta=charge.delta if charge else 0.0,
            n_reports=release.n_reports,
            vocab_size=release.vocab_size,
            max_n=max_n,
            first_window=windows[0],
            last_window=windows[1],
            privacy_unit=unit.describe(),
            reports_per_user=unit.max_reports,
            statement=(preface + " " if preface else "") + release.statement + caveat,
            public_statement=(preface + " " if preface else "")
            + (g.public_statement() if g else release.note)
            + caveat,
            threshold=release.threshold if np.isfinite(release.threshold) else 0.0,
            discovered=release.discovered,
            request_id=request_id,
            channel=release.channel,
            data_dependent_before=data_dependent_before if release.differentially_private else 0,
            exported_windows=exported.windows if exported is not None and dp else 0,
            error_bars=bars.to_dict() if bars is not None else {},
        )

    def with_later_exports(self, exported: ExportedWindows) -> ReleaseRecord:
        """This record as shown after exports of its windows made since it (``exported.later``): a DP release's
        statements gain the caveat of how they compose; a NOT-DP release's are unchanged."""
        if not self.differentially_private:
            return self
        caveat = " " + exported.caveat()
        return replace(self, statement=self.statement + caveat, public_statement=self.public_statement + caveat)

    @property
    def bars(self) -> ErrorBars | None:
        """What its error bars describe (None: made before releases had them)."""
        return ErrorBars.from_dict(self.error_bars) if self.error_bars else None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> ReleaseRecord:
        return cls(**json.loads(data))
