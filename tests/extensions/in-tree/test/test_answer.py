import in_tree

from .utils import EXPECTED


def test_the_installed_package_answers(expected):
    assert in_tree.answer() == EXPECTED == expected
