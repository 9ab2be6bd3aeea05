"""Mean, median and spread of a non-empty list of numbers."""


def _check(values):
    if not values:
        raise ValueError("need at least one value")


def mean(values):
    _check(values)
    return sum(values) / len(values)


def median(values):
    _check(values)
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid] + ordered[mid + 1]) / 2


def spread(values):
    _check(values)
    return max(values) - min(values)
