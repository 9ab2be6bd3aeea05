from pathlib import Path


def test_the_log_was_copied_into_the_image():
    assert Path("/app/access.log").read_text().count("\n") == 7


def test_errors_are_counted():
    assert Path("/app/errors.txt").read_text().strip() == "3"
