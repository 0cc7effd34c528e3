"""Statistics of eval results: epoch reducers, means with confidence intervals,
paired differences, and the summaries of a report or a comparison built from them.

Pure math on lists of floats (no DuckDB, no numpy); :mod:`runtime.eval.store`
fetches the scores and hands them here. Scores of many evals are 0/1
(wrong/right); for those the normal approximation gives intervals outside
[0, 1] and of zero width at 0% or 100%, so :func:`mean_ci` uses the Wilson
score interval for them instead.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from coterie.runtime.eval.records import PairedDiff, ScorerSummary

#: Scores of one run: scorer -> sample_id -> its scored values in epoch order.
ScoredValues = dict[str, dict[str, list[float]]]

#: The group of samples whose ``--by`` field is missing.
NO_GROUP = "(none)"

#: The two-sided z value of a 95% interval (``NormalDist().inv_cdf(0.975)``).
Z_95 = 1.959963984540054


def z_value(confidence: float) -> float:
    """The two-sided z value of a ``confidence`` interval (0 < confidence < 1)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence}")
    if confidence == 0.95:
        return Z_95
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def _stderr(values: list[float]) -> float:
    """Standard error of the mean with the sample standard deviation (n - 1)."""
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values))


def is_binary(values: list[float]) -> bool:
    """Whether every value is 0 or 1 (a right/wrong score)."""
    return all(v == 0.0 or v == 1.0 for v in values)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes / n``."""
    if n <= 0:
        raise ValueError("a proportion needs at least one trial")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and {n}, not {successes}")
    z = z_value(confidence)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # Clamp rounding noise: the interval is within [0, 1] by construction.
    return max(0.0, center - half), min(1.0, center + half)


def mean_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """The mean of ``values`` with a confidence interval: ``(mean, low, high, stderr)``.

    0/1 values get the Wilson score interval; others the normal approximation
    ``mean ± z·stderr``, which has zero width for a single value. ``stderr``
    always uses the sample standard deviation (0 for one value). No values:
    ``ValueError``.
    """
    if not values:
        raise ValueError("mean_ci needs at least one value")
    n = len(values)
    mean = math.fsum(values) / n
    stderr = _stderr(values)
    if is_binary(values):
        low, high = wilson_interval(round(math.fsum(values)), n, confidence)
        return mean, low, high, stderr
    z = z_value(confidence)
    return mean, mean - z * stderr, mean + z * stderr, stderr


def paired_diff(
    a: list[float], b: list[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """The mean of ``b[i] - a[i]`` with a normal confidence interval: ``(diff, low, high)``.

    Pairing (the same samples under both runs) removes the variation between
    samples, so the interval is narrower than comparing two independent means.
    One pair gives a zero-width interval; none, or lists of different lengths,
    ``ValueError``.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_diff needs lists of one length, not {len(a)} and {len(b)}")
    if not a:
        raise ValueError("paired_diff needs at least one pair")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    diff = math.fsum(diffs) / len(diffs)
    half = z_value(confidence) * _stderr(diffs)
    return diff, diff - half, diff + half


def reduce_epochs(reducer: str, values: list[float]) -> float:
    """Reduce one sample's scores over its epochs (in epoch order) to one value.

    ``mean``, ``max``, ``min``, ``median``, ``mode`` (the most common value;
    the earliest on a tie) and ``pass@k``: the unbiased estimate
    ``1 - C(n-c, k) / C(n, k)`` of the chance that one of k tries is right,
    where c counts values >= 1.0 among the n epochs. A sample with fewer than
    k scored epochs (some errored) uses k = n. Unknown reducer: ``ValueError``.
    """
    if not values:
        raise ValueError(f"reducer {reducer!r} got no values")
    if reducer == "mean":
        return math.fsum(values) / len(values)
    if reducer == "max":
        return max(values)
    if reducer == "min":
        return min(values)
    if reducer == "median":
        return float(statistics.median(values))
    if reducer == "mode":
        return Counter(values).most_common(1)[0][0]
    k_text = reducer.removeprefix("pass@")
    if k_text != reducer and k_text.isdigit() and int(k_text) >= 1:
        n = len(values)
        k = min(int(k_text), n)
        c = sum(1 for v in values if v >= 1.0)
        return 1.0 - math.comb(n - c, k) / math.comb(n, k)
    raise ValueError(f"unknown reducer {reducer!r} (known: mean, max, min, median, mode, pass@K)")


def scorer_order(declared: list[str], values: ScoredValues) -> list[str]:
    """The scorers that have values: the declared ones first, in their order."""
    return [s for s in declared if s in values] + sorted(set(values) - set(declared))


def _summary(scorer: str, reducer: str, group: str | None, values: list[float]) -> ScorerSummary:
    mean, low, high, stderr = mean_ci(values)
    return ScorerSummary(
        scorer=scorer,
        reducer=reducer,
        group=group,
        n=len(values),
        mean=mean,
        ci_low=low,
        ci_high=high,
        stderr=stderr,
    )


def summarize(
    values: ScoredValues,
    *,
    scorers: list[str],
    reducers: list[str],
    groups: dict[str, str] | None = None,
) -> list[ScorerSummary]:
    """Per scorer and reducer: each sample's epochs reduced, then the mean over
    samples with its 95% CI.

    With ``groups`` (sample_id -> group label) each overall summary is followed
    by one per group, in sorted order; samples without a label go to
    :data:`NO_GROUP`.
    """
    summaries: list[ScorerSummary] = []
    for scorer in scorer_order(scorers, values):
        for reducer in reducers:
            reduced = {sid: reduce_epochs(reducer, vs) for sid, vs in values[scorer].items()}
            summaries.append(_summary(scorer, reducer, None, list(reduced.values())))
            if groups is None:
                continue
            by_group: dict[str, list[float]] = defaultdict(list)
            for sid, value in reduced.items():
                by_group[groups.get(sid, NO_GROUP)].append(value)
            summaries.extend(_summary(scorer, reducer, g, by_group[g]) for g in sorted(by_group))
    return summaries


def compare_scores(
    values_a: ScoredValues, values_b: ScoredValues, *, scorers: list[str], reducers: list[str]
) -> list[PairedDiff]:
    """Run b against run a per scorer both have and per reducer, on the samples
    both scored: the paired difference b - a and the flips.

    A reduced value is right when >= 1.0 for a binary scorer (every raw value
    of both runs 0 or 1), >= 0.5 otherwise.
    """
    diffs: list[PairedDiff] = []
    for scorer in scorer_order(scorers, values_a):
        by_a, by_b = values_a[scorer], values_b.get(scorer, {})
        ids = sorted(by_a.keys() & by_b.keys())
        if not ids:
            continue
        threshold = 1.0 if is_binary([v for i in ids for v in (*by_a[i], *by_b[i])]) else 0.5
        for reducer in reducers:
            xa = [reduce_epochs(reducer, by_a[i]) for i in ids]
            xb = [reduce_epochs(reducer, by_b[i]) for i in ids]
            diff, low, high = paired_diff(xa, xb)
            right = [(x >= threshold, y >= threshold) for x, y in zip(xa, xb, strict=True)]
            diffs.append(
                PairedDiff(
                    scorer=scorer,
                    reducer=reducer,
                    n=len(ids),
                    mean_a=math.fsum(xa) / len(xa),
                    mean_b=math.fsum(xb) / len(xb),
                    diff=diff,
                    ci_low=low,
                    ci_high=high,
                    a_only_right=sum(1 for x, y in right if x and not y),
                    b_only_right=sum(1 for x, y in right if y and not x),
                )
            )
    return diffs


__all__ = [
    "NO_GROUP",
    "Z_95",
    "ScoredValues",
    "compare_scores",
    "is_binary",
    "mean_ci",
    "paired_diff",
    "reduce_epochs",
    "scorer_order",
    "summarize",
    "wilson_interval",
    "z_value",
]
