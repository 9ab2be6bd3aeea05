"""Reference solution of newsletter-signup: a scripted browser run."""

import os

from browser_cdp import Browser

with Browser.launch(os.environ.get("HOME", "/tmp")) as browser:
    page = browser.page
    page.goto("http://127.0.0.1:8765/")
    page.type(page.find("textbox", "Email address"), "ada@example.org")
    page.click(page.find("button", "Subscribe"))
    print(page.observe().text)
