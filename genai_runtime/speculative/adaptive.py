"""Adaptive draft length: how many tokens to verify per round, from acceptance and pass cost."""

from __future__ import annotations

_FIRST_WAIT, _LONGEST_WAIT = 4, 64  # plain rounds before a bucket that drafts nothing probes
_STEP_EVERY = 64  # wide passes between two plain rounds that re-time a one-token step


class Probe:
    """When plain rounds win, a draft now and then keeps an acceptance rate current: due after
    4 plain rounds, and each probe that keeps nothing doubles the wait (up to 64)."""

    def __init__(self) -> None:
        self.wait = _FIRST_WAIT
        self.skipped = 0

    def due(self) -> bool:
        """Count a plain round; True when it is time to probe instead."""
        self.skipped += 1
        if self.skipped < self.wait:
            return False
        self.skipped = 0
        return True

    def result(self, accepted: int) -> None:
        self.wait = _FIRST_WAIT if accepted else min(2 * self.wait, _LONGEST_WAIT)


class AdaptiveK:
    """Draft length from the recent acceptance rate and what a wider target pass costs.

    Keeps, per proposal bucket (n-gram: the matched n; other proposers: one bucket), an
    exponential average ``a`` of accepted / proposed, and one of ``r``, the extra time of each
    token a verify pass feeds beyond the first as a fraction of a one-token pass (fed by
    ``timed``; 0.5 until measured). Treating acceptance as geometric, K drafts yield
    ``1 + a + ... + a**K`` tokens for ``1 + r*K`` of a plain step's time; ``choose`` returns the
    K that maximises that within [min_k, max_k], or 0 when no K beats a plain step. Such a
    bucket still drafts ``min_k`` as a probe after 4 plain rounds, so the rate can recover; each
    probe that keeps nothing doubles that wait (up to 64). On a CPU where a wide pass costs
    almost as much per token as a narrow one, unlikely drafts are pure loss.
    """

    def __init__(self, max_k: int, min_k: int = 1, adaptive: bool = True, decay: float = 0.7):
        self.max_k, self.min_k, self.adaptive, self.decay = max_k, min_k, adaptive, decay
        self.extra = 0.5  # r: cost of each extra token in a pass / cost of a one-token pass
        self._step: float | None = None  # seconds of a one-token pass (EMA)
        self._since_step = 0  # wide passes timed since the last one-token pass
        self._rate: dict[int, float] = {}
        self._k: dict[int, int] = {}
        self._probes: dict[int, Probe] = {}  # per bucket whose K is 0

    @property
    def k(self) -> int:
        """The current K of the default bucket."""
        return self._k.get(0, self.max_k)

    def rate(self, bucket: int = 0) -> float:
        return self._rate.get(bucket, 0.75)

    def wants_plain_step(self) -> bool:
        """Whether the next round should verify nothing, so that a one-token pass is timed:
        without one, wide passes cannot be priced and ``extra`` keeps its prior (every round
        drafting from the start would never measure it)."""
        return self.adaptive and (self._step is None or self._since_step >= _STEP_EVERY)

    def timed(self, width: int, seconds: float) -> None:
        """A target pass over ``width`` tokens took ``seconds``."""
        if width == 1:
            self._step = seconds if self._step is None else 0.8 * self._step + 0.2 * seconds
            self._since_step = 0
        elif self._step:
            extra = max((seconds - self._step) / (width - 1) / self._step, 0.0)
            self.extra = 0.8 * self.extra + 0.2 * extra
            self._since_step += 1

    def choose(self, bucket: int = 0) -> int:
        """Drafts to verify for a proposal of ``bucket`` (0: draft nothing this round)."""
        k = self._k.get(bucket, self.max_k)
        if k:
            return k
        return max(self.min_k, 1) if self._probes.setdefault(bucket, Probe()).due() else 0

    def update(self, accepted: int, proposed: int, bucket: int = 0) -> None:
        if not self.adaptive or proposed == 0:
            return
        if self._k.get(bucket) == 0:  # a probe
            self._probes.setdefault(bucket, Probe()).result(accepted)
        rate = self._rate[bucket] = (
            self.decay * self.rate(bucket) + (1 - self.decay) * accepted / proposed
        )
        best, best_gain, tokens, term = 0, 1.0, 1.0, 1.0
        for k in range(1, self.max_k + 1):
            term *= rate
            tokens += term
            gain = tokens / (1.0 + self.extra * k)
            if gain > best_gain:
                best, best_gain = k, gain
        self._k[bucket] = max(self.min_k, min(self.max_k, best)) if best else 0
