"""Group advantages against hand-computed values."""

import numpy as np
import pytest

from rollway.common.advantages import group_normalised, leave_one_out, sequence_advantages, zero_std_groups


def test_grpo_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, std 0.5 -> +-1 (up to the 1e-6 epsilon)
    # group 2: rewards 0, 0, 0, 3 -> mean 0.75, std sqrt(1.6875)=1.299038
    adv = sequence_advantages("grpo", [1, 0, 0, 1, 0, 0, 0, 3], 4)
    np.testing.assert_allclose(adv[:4], [0.999998, -0.999998, -0.999998, 0.999998], atol=1e-6)
    np.testing.assert_allclose(adv[4:], [-0.577350, -0.577350, -0.577350, 1.732050], atol=1e-5)


def test_dr_grpo_has_no_std():
    adv = sequence_advantages("grpo", [1, 0, 0, 1, 0, 0, 0, 3], 4, disable_grpo_std_normalization=True)
    np.testing.assert_allclose(adv, [0.5, -0.5, -0.5, 0.5, -0.75, -0.75, -0.75, 2.25])


def test_single_sample_groups_skip_std():
    np.testing.assert_allclose(group_normalised([2.0, 5.0], 1), [0.0, 0.0])


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
