import unittest

from textstats import mean, median, spread


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_of_odd_count(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_median_of_even_count(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
        self.assertEqual(median([10, 20]), 15)

    def test_spread(self):
        self.assertEqual(spread([5, -1, 3]), 6)

    def test_empty_is_an_error(self):
        for f in (mean, median, spread):
            with self.assertRaises(ValueError):
                f([])


if __name__ == "__main__":
    unittest.main()
