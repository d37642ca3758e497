"""serving.ratelimit: a per-client token bucket and a server-wide slot count."""

import pytest
from memgnn.serving.ratelimit import Limited, RateLimit, RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_one_call_per_refill_per_client():
    clock = Clock()
    limiter = RateLimiter(RateLimit(rate_per_min=6, burst=2, slots=10), clock=clock)
    for _ in range(2):
        with limiter.take("a"):
            pass
    with pytest.raises(Limited) as exc:
        limiter.acquire("a")
    assert exc.value.retry_after_s == pytest.approx(10.0)  # 6 a minute: one per 10 s
    with limiter.take("b"):  # another client has its own bucket
        pass
    clock.now = 9.9
    with pytest.raises(Limited):
        limiter.acquire("a")
    clock.now = 10.0
    with limiter.take("a"):
        pass


def test_slots_bound_calls_at_once_across_clients_and_a_refusal_takes_nothing():
    limiter = RateLimiter(RateLimit(rate_per_min=60, burst=5, slots=1), clock=Clock())
    limiter.acquire("a")
    with pytest.raises(Limited, match="already running"):
        limiter.acquire("b")
    limiter.release()
    with limiter.take("b"):  # b's refused call did not spend its bucket
        pass
    for _ in range(4):
        with limiter.take("b"):
            pass
    with pytest.raises(Limited, match="calls a minute"):
        limiter.acquire("b")  # 5 taken of a burst of 5


def test_the_client_table_is_bounded():
    limiter = RateLimiter(RateLimit(), clock=Clock(), max_clients=3)
    for client in "abcdef":
        with limiter.take(client):
            pass
    assert len(limiter._buckets) == 3


@pytest.mark.parametrize(
    "kwargs", [{"rate_per_min": 0}, {"rate_per_min": float("nan")}, {"burst": 0}, {"slots": True}]
)
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(ValueError):
        RateLimit(**kwargs)
