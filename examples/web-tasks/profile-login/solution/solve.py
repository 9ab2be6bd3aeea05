"""Reference solution of profile-login: a scripted browser run."""

import os

from browser_cdp import Browser

with Browser.launch(os.environ.get("HOME", "/tmp")) as browser:
    page = browser.page
    page.goto("http://127.0.0.1:8765/")
    page.type(page.find("textbox", "User name"), "grace")
    page.type(page.find("textbox", "Password"), "hopper1906")
    page.click(page.find("button", "Sign in"))
    page.type(page.find("textbox", "Display name"), "Amazing Grace")
    page.click(page.find("button", "Save profile"))
    print(page.observe().text)
