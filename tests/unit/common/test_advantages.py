"""Group advantages against hand-computed values."""

import numpy as np
import pytest

from rollway.common.advantages import group_normalised, leave_one_out, sequence_advantages, zero_std_groups


def test_grpo_divides_by_the_sample_std_as_miles():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, sample std sqrt(1/3) = 0.577350 -> +-0.866025
    # group 2: rewards 0, 0, 0, 3 -> mean 0.75, sample std 1.5 -> -0.5, -0.5, -0.5, 1.5
    adv = sequence_advantages("grpo", [1, 0, 0, 1, 0, 0, 0, 3], 4)
    np.testing.assert_allclose(adv[:4], [0.866024, -0.866024, -0.866024, 0.866024], atol=1e-5)
    np.testing.assert_allclose(adv[4:], [-0.5, -0.5, -0.5, 1.5], atol=1e-5)
    # Rewards 0, 1 (n = 2): +-0.707, not the population std's +-1.0 (issue 13).
    np.testing.assert_allclose(sequence_advantages("gspo", [0, 1], 2), [-0.707106, 0.707106], atol=1e-5)


def test_dr_grpo_has_no_std():
    expected = [0.5, -0.5, -0.5, 0.5, -0.75, -0.75, -0.75, 2.25]
    adv = sequence_advantages("grpo", [1, 0, 0, 1, 0, 0, 0, 3], 4, disable_grpo_std_normalization=True)
    np.testing.assert_allclose(adv, expected)
    np.testing.assert_allclose(sequence_advantages("dr_grpo", [1, 0, 0, 1, 0, 0, 0, 3], 4), expected)


def test_single_sample_groups_skip_std():
    np.testing.assert_allclose(group_normalised([2.0, 5.0], 1), [0.0, 0.0])
    assert np.isfinite(sequence_advantages("grpo", [2.0, 5.0], 1)).all()


def test_disable_rewards_normalization_sends_raw_rewards():
    for estimator in ("grpo", "gspo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"):
        adv = sequence_advantages(estimator, [1, 0, 3, 3], 2, disable_rewards_normalization=True)
        np.testing.assert_allclose(adv, [1, 0, 3, 3])


def test_rloo_leaves_one_out():
    # r = 1, 2, 3 -> 1 - 2.5, 2 - 2, 3 - 1.5
    np.testing.assert_allclose(leave_one_out([1, 2, 3], 3), [-1.5, 0.0, 1.5])


def test_reinforce_variants():
    np.testing.assert_allclose(sequence_advantages("reinforce_plus_plus", [1, 0], 2), [1, 0])
    np.testing.assert_allclose(
        sequence_advantages("reinforce_plus_plus_baseline", [1, 0, 4, 4], 2), [0.5, -0.5, 0, 0]
    )


def test_zero_std_groups_and_errors():
    assert zero_std_groups([1, 1, 0, 1, 2, 2], 2).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="groups of 4"):
        group_normalised([1, 2, 3], 4)
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        sequence_advantages("ppo", [1], 1)
