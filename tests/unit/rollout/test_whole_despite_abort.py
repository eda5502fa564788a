"""A sample that an abort overtook after its last token is reported whole (finish "length"), so a
partial rollout does not send it back to continue with nothing left to generate."""

from __future__ import annotations

from rollway.rollout.engines.base import FINISH_ABORT, FINISH_LENGTH, SampleRequest, SampleResult
from rollway.rollout.generate_stream import whole_despite_abort
from rollway.rollout.sampling import SamplingParams


def result(num_tokens: int, max_new_tokens: int = 4, **extra) -> SampleResult:
    request = SampleRequest(
        index=0, prompt_token_ids=(1, 2), params=SamplingParams(max_new_tokens=max_new_tokens)
    )
    return SampleResult(request, token_ids=list(range(num_tokens)), log_probs=[0.0] * num_tokens, **extra)


def test_an_abort_after_the_last_token_is_a_length_finish():
    assert whole_despite_abort(result(4, finish_reason=FINISH_ABORT)).finish_reason == FINISH_LENGTH


def test_an_abort_before_the_last_token_stays_an_abort():
    assert whole_despite_abort(result(3, finish_reason=FINISH_ABORT)).finish_reason == FINISH_ABORT


def test_a_failed_sample_and_an_episode_keep_their_abort():
    failed = result(4, finish_reason=FINISH_ABORT, error="server died")
    assert whole_despite_abort(failed).finish_reason == FINISH_ABORT
    episode = result(4, finish_reason=FINISH_ABORT, episode=object())
    assert whole_despite_abort(episode).finish_reason == FINISH_ABORT
