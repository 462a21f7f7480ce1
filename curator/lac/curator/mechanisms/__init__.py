"""The central mechanisms, one module each, behind one protocol and one registry, and the request they run.

Each module of this package exposes one object, ``MECHANISM``, in the shape of OpenDP's
measurement: validated, frozen parameters (``ReleaseSpec``, defined here: the request, checked against
the mechanism's ``knobs``), a privacy map (``charge``: the (ε, δ) a spec spends), the noise the accuracy
preview reads (``noise``, from the spec and a ``PublicContext``) and ``run(spec, inputs)``, turning the
reports and public context of ``ReleaseInputs`` into a ``lac.curator.release.building.Release`` that carries
its typed ``Guarantee`` and, when asked (``inputs.errors``), its per-item error bars
(``lac.curator.release.errorbars``). ``release`` (here) is the one way a spec is run: it stamps the release
with the charge of the mechanism's privacy map (None when the spec is data-dependent), the only charge
anyone reads: the handler's check before the run, the preview and the ledger after it. The request goes
from the RPC (``lac.curator.service.serde``) to the noise draw as this one ``ReleaseSpec``. The mechanisms
are built from the algorithms of ``lac.curator.release``.

Everything that dispatches on a mechanism's name (``ReleaseSpec``, ``lac.curator.runner.run``, the RPC
translations in ``lac.curator.service.serde``, the preview, the CLI, ``lac eval``) asks this registry.
Adding a mechanism is one new module here (found at import, ordered by its ``rank``) or, from
outside the package, one ``register`` call.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from numbers import Real
from typing import Any, Protocol

from lac.common.checks import check_int
from lac.common.privacy import Budget, PrivacyUnit, check_delta, check_epsilon
from lac.curator.base.ngrams import NgramVocabulary
from lac.curator.release.bayesian import SENSITIVITY_METHODS
from lac.curator.release.building import PublicCaps, Release, ReleaseInputs
from lac.curator.release.gaussian import METHODS as CALIBRATIONS

__all__ = [
    "ReleaseSpec",
    "ReleaseInputs",
    "release",
    "Defaults",
    "Mechanism",
    "PublicContext",
    "LogitNoise",
    "ItemNoise",
    "KNOBS",
    "Knob",
    "REGISTRY",
    "register",
    "unregister",
    "get",
    "names",
    "over_rpc",
    "offline_only",
    "with_knob",
]

# The request knobs the built-in mechanisms share (``ReleaseSpec`` fields, listed by a mechanism's ``knobs``). A
# knob of one mechanism only is declared by it (``Knob``, its ``options``) and travels in ``ReleaseSpec.options``.
KNOBS = frozenset({"sensitivity", "public_sensitivity", "S", "rho", "calibration", "discovery", "K", "channel"})


@dataclass(frozen=True)
class Knob:
    """A knob a mechanism declares for itself: its name, default and check (the validated value, or ValueError).
    ``ReleaseSpec`` refuses it on any other mechanism."""

    name: str
    default: Any
    check: Callable[[Any], Any]
    help: str = ""


@dataclass(frozen=True)
class PublicContext:
    """What the accuracy preview knows besides the request: the public vocabulary and caps, the privacy unit
    and L, the public corpus's mean sentence length (``lac.curator.runner.preview``)."""

    vocab: NgramVocabulary
    caps: PublicCaps
    unit: PrivacyUnit
    words_per_report: float = 1.0


@dataclass(frozen=True)
class LogitNoise:
    """Gaussian noise on the logits (BayesianDP, EndToEndDP): it does not shrink with more reports.
    ``sigma`` is NaN when the calibration is data-dependent (known only after the release)."""

    sigma: float
    sigma_at: Callable[[float], float]  # σ as a function of ε (what ε would bring σ down)
    remedy: str  # the advice when σ swamps the logits


@dataclass(frozen=True)
class ItemNoise:
    """Per-item noise of standard deviation ``noise_at(ε)`` in ``unit``; an item of share π expects
    π·``per_report`` per report (``fixed``: π·``per_report`` once, whatever the number of reports)."""

    noise_at: Callable[[float], float]
    unit: str
    per_report: float
    fixed: bool
    remedies: tuple[str, ...] = ()  # what else helps when the release is swamped


class Mechanism(Protocol):
    """One central mechanism: its name, where it runs, its knobs, its privacy map and its run."""

    @property
    def name(self) -> str: ...
    @property
    def rank(self) -> int:
        """Its place in listings (lower first)."""

    @property
    def over_rpc(self) -> bool:
        """False: offline only (never over RPC)."""

    @property
    def takes_epsilon(self) -> bool:
        """False: ε means nothing to it (k-anonymity)."""

    @property
    def with_delta(self) -> bool:
        """True: it spends a δ > 0 (False: pure ε-DP, or no guarantee)."""

    @property
    def knobs(self) -> frozenset[str]:
        """The shared request knobs (``KNOBS``) that apply to it."""

    @property
    def options(self) -> tuple[Knob, ...]:
        """The knobs it declares for itself (``ReleaseSpec.options``)."""

    def validate(self, spec: ReleaseSpec) -> None:
        """Mechanism-specific checks of a spec beyond the knobs (ValueError)."""

    def data_dependent(self, spec: ReleaseSpec) -> bool:
        """True when the requested calibration looks at the data (NOT differentially private)."""

    def charge(self, spec: ReleaseSpec) -> Budget:
        """The (ε, δ) a DP release of ``spec`` spends from each window it covers."""

    def noise(self, spec: ReleaseSpec, ctx: PublicContext) -> LogitNoise | ItemNoise | None:
        """The noise the accuracy preview predicts ``spec`` to add (None: nothing to predict)."""

    def run(self, spec: ReleaseSpec, inputs: ReleaseInputs) -> Release:
        """The release of ``spec`` over ``inputs.reports``, with its error bars unless ``inputs.errors`` is None (a
        release that is not DP gets none, with the reason); its ``charge`` is left to ``release``."""


class Defaults:
    """What a mechanism's object inherits unless it says otherwise: no checks beyond the knobs, and a DP
    release spends (ε, δ) from each window it covers, δ = 0 for a pure ε-DP mechanism (``with_delta``)."""

    with_delta: bool
    options: tuple[Knob, ...] = ()

    def validate(self, spec: ReleaseSpec) -> None:
        """No mechanism-specific checks."""

    def charge(self, spec: ReleaseSpec) -> Budget:
        """(ε, δ), or (ε, 0) when the mechanism is pure ε-DP."""
        return Budget(spec.epsilon, spec.delta if self.with_delta else 0.0)


REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Add ``mechanism`` to the registry (ValueError if its name is taken)."""
    if mechanism.name in REGISTRY:
        raise ValueError(f"mechanism {mechanism.name!r} is already registered")
    unknown = set(mechanism.knobs) - KNOBS
    if unknown:
        raise ValueError(f"mechanism {mechanism.name!r}: unknown knobs {sorted(unknown)}")
    clash = {k.name for k in mechanism.options} & (KNOBS | set(ReleaseSpec.__dataclass_fields__))
    if clash:
        raise ValueError(f"mechanism {mechanism.name!r}: its own knobs {sorted(clash)} are request fields")
    REGISTRY[mechanism.name] = mechanism
    ordered = sorted(REGISTRY.values(), key=lambda m: m.rank)
    REGISTRY.clear()
    REGISTRY.update((m.name, m) for m in ordered)
    return mechanism


def unregister(name: str) -> None:
    """Remove a mechanism (tests)."""
    REGISTRY.pop(name, None)


def get(name: str) -> Mechanism:
    """The mechanism called ``name`` (KeyError if none)."""
    return REGISTRY[name]


def names() -> tuple[str, ...]:
    """Every registered mechanism, in listing order."""
    return tuple(REGISTRY)


def over_rpc() -> tuple[str, ...]:
    """The mechanisms a request over RPC may name."""
    return tuple(n for n, m in REGISTRY.items() if m.over_rpc)


def offline_only() -> tuple[str, ...]:
    """The mechanisms that run offline only (NOT differentially private)."""
    return tuple(n for n, m in REGISTRY.items() if not m.over_rpc)


def with_knob(knob: str) -> tuple[str, ...]:
    """The mechanisms ``knob`` (shared, or declared by a mechanism) applies to."""
    return tuple(n for n, m in REGISTRY.items() if knob in m.knobs or any(k.name == knob for k in m.options))


@dataclass(frozen=True)
class ReleaseSpec:
    """One release request. Defaults here are the release defaults everywhere."""

    epsilon: float
    delta: float = 1e-6
    mechanism: str = "posterior"
    sensitivity: str = "sound"
    S: float = 0.01
    rho: float = 0.5
    calibration: str = "auto"
    public_sensitivity: str = "sound"
    first_window: int | None = None
    last_window: int | None = None
    K: int = 50  # k-anonymity threshold (offline only)
    discovery: bool = True  # posterior: DP discovery of n-grams outside the public vocabulary
    force: bool = False  # release even if the accuracy check predicts the noise would swamp the signal
    expected_reports: int | None = None  # the number of reports the accuracy check assumes (lac.curator.runner.preview)
    options: dict[str, Any] = field(default_factory=dict)  # the mechanism's own knobs (``Knob``), checked, defaulted

    def __post_init__(self) -> None:
        if self.expected_reports is not None:
            object.__setattr__(self, "expected_reports", check_int(self.expected_reports, "expected_reports"))
        if self.mechanism not in REGISTRY:
            raise ValueError(f"unknown mechanism {self.mechanism!r}; available: {', '.join(over_rpc())}")
        m = get(self.mechanism)
        if m.takes_epsilon:
            check_epsilon(self.epsilon)
        if m.with_delta:
            check_delta(self.delta, allow_zero=False)
        if self.sensitivity not in SENSITIVITY_METHODS:
            raise ValueError(f"unknown sensitivity {self.sensitivity!r}; available: {', '.join(SENSITIVITY_METHODS)}")
        if self.public_sensitivity not in ("sound", "observed"):
            raise ValueError(f"unknown public_sensitivity {self.public_sensitivity!r}; available: sound, observed")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {self.calibration!r}; available: {', '.join(CALIBRATIONS)}")
        # a shared knob set away from its default on a mechanism that would ignore it (discovery is refused only when
        # a request sends it: the offline CLI turns it off for every mechanism)
        defaults = {f.name: f.default for f in fields(self)}
        for knob in ("sensitivity", "public_sensitivity", "calibration", "S", "rho", "K"):
            value = getattr(self, knob)
            if knob not in m.knobs and value != defaults[knob]:
                raise ValueError(
                    f"{knob} = {value!r} applies to {' and '.join(with_knob(knob))} only, not {self.mechanism!r}"
                )
        if isinstance(self.S, bool) or not (isinstance(self.S, Real) and math.isfinite(self.S) and self.S > 0):
            raise ValueError(f"S must be a finite number > 0, got {self.S!r}")
        if isinstance(self.rho, bool) or not (isinstance(self.rho, Real) and 0 < self.rho <= 1):
            raise ValueError(f"rho must be in (0, 1], got {self.rho!r}")
        if (self.first_window is None) != (self.last_window is None):
            raise ValueError("give both first_window and last_window, or neither")
        if self.first_window is not None and self.first_window > self.last_window:
            raise ValueError("first_window must not be after last_window")
        object.__setattr__(self, "options", _checked_options(m, self.options))
        m.validate(self)

    def as_dict(self) -> dict[str, Any]:
        """The spec as JSON-ready values (its options only when its mechanism declares any)."""
        d = asdict(self)
        if not d["options"]:
            del d["options"]
        return d

    @property
    def data_dependent(self) -> bool:
        """True when the requested calibration looks at the data (NOT differentially private)."""
        return get(self.mechanism).data_dependent(self)

    @property
    def budget(self) -> Budget:
        """The (ε, δ) this release spends from each window it covers when it is DP."""
        return get(self.mechanism).charge(self)


def release(spec: ReleaseSpec, inputs: ReleaseInputs) -> Release:
    """Run ``spec`` by its mechanism and stamp the result with the charge of the mechanism's privacy map
    (None: data-dependent, never charged). A guarantee that disagrees with the map is a bug, refused here."""
    m = get(spec.mechanism)
    charge = None if m.data_dependent(spec) else m.charge(spec)
    r = m.run(spec, inputs)
    if r.differentially_private != (charge is not None):
        raise RuntimeError(
            f"mechanism {spec.mechanism!r}: its release is {'' if r.differentially_private else 'not '}DP "
            f"but its privacy map charges {charge}"
        )
    return replace(r, charge=charge)


def _checked_options(m: Mechanism, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` checked against the knobs ``m`` declares, with their defaults (ValueError for another's knob)."""
    own = {k.name: k for k in m.options}
    for name in given:
        if name not in own:
            others = with_knob(name)
            raise ValueError(
                f"knob {name!r} applies to {' and '.join(others)} only" if others else f"unknown knob {name!r}"
            )
    return {n: k.check(given[n]) if n in given else k.default for n, k in own.items()}


def _load_builtin() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            register(importlib.import_module(f"{__name__}.{info.name}").MECHANISM)


_load_builtin()
