
import pytest

from radixlm.request import IllegalTransitionError, Request, RequestStatus
from radixlm.sampling_params import SamplingParams

S = RequestStatus


def make(prompt_len=5):
    return Request("r", list(range(prompt_len)), SamplingParams(), arrival_time=100.0)


@pytest.mark.parametrize("path", [
    [S.RUNNING, S.FINISHED_STOPPED],
    [S.RUNNING, S.FINISHED_LENGTH],
    [S.RUNNING, S.FINISHED_ABORTED],
    [S.FINISHED_ABORTED],
    [S.RUNNING, S.PREEMPTED, S.WAITING, S.RUNNING, S.FINISHED_STOPPED],
    [S.RUNNING, S.PREEMPTED, S.FINISHED_ABORTED],
])
def test_legal_paths(path):
    request = make()
    for status in path:
        request.transition(status)
    assert request.status is path[-1]


@pytest.mark.parametrize(("path", "bad"), [
    ([], S.PREEMPTED), ([], S.FINISHED_STOPPED), ([S.RUNNING], S.WAITING),
    ([S.RUNNING, S.PREEMPTED], S.RUNNING), ([S.RUNNING, S.FINISHED_STOPPED], S.RUNNING),
    ([S.FINISHED_ABORTED], S.FINISHED_ABORTED),
])
def test_illegal_transitions_raise(path, bad):
    request = make()
    for status in path:
        request.transition(status)
    with pytest.raises(IllegalTransitionError, match=f"{path[-1].name if path else 'WAITING'} -> {bad.name}"):
        request.transition(bad)


def test_timestamps_give_queue_time_ttft_and_e2e():
    request = make()
    request.transition(S.RUNNING, now=101.0)
    request.record_token_time(103.0)
    request.record_token_time(104.0)
    request.transition(S.FINISHED_STOPPED, now=105.0)
    assert (request.times.queue_time, request.times.ttft, request.times.e2e) == (1.0, 3.0, 5.0)
    assert request.status.finish_reason == "stop"


def test_preemption_keeps_first_scheduled_time_and_counts():
    request = make()
    request.transition(S.RUNNING, now=101.0)
    request.transition(S.PREEMPTED)
    request.transition(S.WAITING)
    request.transition(S.RUNNING, now=110.0)
    assert request.times.first_scheduled == 101.0
    assert request.num_preemptions == 1


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="prompt"):
        Request("r", [], SamplingParams())
