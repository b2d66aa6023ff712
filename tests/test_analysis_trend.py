"""The trend statistic the rules read (Theil-Sen slope, Sen's interval, Mann-Kendall): a claim only
when the interval supports it, so a short or noisy series claims nothing."""

from __future__ import annotations

import numpy as np

from gradwidget.analysis.trend import MIN_POINTS, theil_sen


def _noisy(n, rate, sigma=0.15, seed=0):
    """A loss falling by ``rate`` per step (multiplicative) with log-normal batch noise."""
    rng = np.random.default_rng(seed)
    return 2.3 * (1 - rate) ** np.arange(n) * np.exp(sigma * rng.standard_normal(n))


def test_a_noisy_fall_of_one_percent_a_step_is_falling_over_40_steps_but_not_10():
    assert theil_sen(_noisy(40, 0.012)).falling
    short = theil_sen(_noisy(10, 0.012))
    assert short is not None and not short.falling and not short.rising  # too few steps to say


def test_flatness_is_claimed_only_when_the_interval_is_inside_the_band():
    rng = np.random.default_rng(1)
    level, r, total = 1.5, 1e-3, 0.05
    long = theil_sen(level + 0.1 * rng.standard_normal(200))
    short = theil_sen(level + 0.1 * rng.standard_normal(30))
    assert long.flat_within(r * level, total * level)
    assert not short.flat_within(r * level, total * level)  # as likely falling 1% a step as flat
    assert not theil_sen(_noisy(120, 0.01)).flat_within(r * level, total * level)


def test_the_slope_is_robust_to_spikes_and_ignores_non_finite_points():
    y = 3.0 - 0.01 * np.arange(100)
    y[::10] += 50  # loss spikes on one batch in ten
    y[5] = np.nan
    tr = theil_sen(y)
    assert abs(tr.slope + 0.01) < 1e-3 and tr.falling and tr.n == 99
    assert theil_sen(np.ones(MIN_POINTS - 1)) is None


def test_long_series_are_block_averaged_and_keep_their_slope():
    x = np.arange(100_000, dtype=float)
    tr = theil_sen(5 - 1e-5 * x + 0.01 * np.random.default_rng(2).standard_normal(x.size), x)
    assert tr.n <= 400 and abs(tr.slope + 1e-5) < 1e-6 and tr.span > 99_000
