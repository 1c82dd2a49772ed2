import plain_c


def test_twice():
    assert plain_c.twice(21) == 42
