"""Reference solution of shop-order: a scripted browser run."""

import os

from browser_cdp import Browser

with Browser.launch(os.environ.get("HOME", "/tmp")) as browser:
    page = browser.page
    page.goto("http://127.0.0.1:8765/")
    page.click(page.find("link", "Blue Mug"))
    page.type(page.find("spinbutton", "Quantity"), "2")
    page.click(page.find("button", "Add to cart"))
    page.click(page.find("link", "Checkout"))
    page.type(page.find("textbox", "Full name"), "Ada Lovelace")
    page.type(page.find("textbox", "Street address"), "12 Analytical Street")
    page.click(page.find("button", "Place order"))
    print(page.observe().text)
