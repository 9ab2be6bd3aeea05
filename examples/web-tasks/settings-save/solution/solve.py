"""Reference solution of settings-save: a scripted browser run."""

import os

from browser_cdp import Browser

with Browser.launch(os.environ.get("HOME", "/tmp")) as browser:
    page = browser.page
    page.goto("http://127.0.0.1:8765/settings")
    page.select(page.find("combobox", "Theme"), "Dark")
    page.click(page.find("checkbox", "Email notifications"))
    page.click(page.find("button", "Save settings"))
    print(page.observe().text)
