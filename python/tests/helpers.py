"""Shared helpers of the tests: bitwise comparison and the rounding bound."""

import torch

EPS = 2.0**-24  # the unit roundoff of float32


def bits(t):
    """The float32 tensor's bits, so that -0.0 and 0.0 (and NaNs) compare as bits."""
    return t.detach().contiguous().view(torch.int32)


def assert_bitwise(ours, theirs):
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(bits(ours), bits(theirs)), (ours - theirs).abs().max()


def assert_within_sum_bound(ours, theirs, abs_sum, terms):
    """Both are float32 sums of at most ``terms`` products whose magnitudes add up to
    ``abs_sum`` (computed in float64): each is within terms * EPS * abs_sum of the exact
    value (the classic bound for recursive summation, one more term for a product or a
    division), so they are within twice that of each other."""
    bound = 2 * (terms + 1) * EPS * abs_sum
    diff = (ours.double() - theirs.double()).abs()
    assert torch.all(diff <= bound), (diff - bound).max()
