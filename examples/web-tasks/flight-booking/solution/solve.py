"""Reference solution of flight-booking: a scripted browser run that reads the results table."""

import os

from browser_cdp import Browser

with Browser.launch(os.environ.get("HOME", "/tmp")) as browser:
    page = browser.page
    page.goto("http://127.0.0.1:8765/")
    page.select(page.find("combobox", "From"), "Lisbon")
    page.select(page.find("combobox", "To"), "Oslo")
    page.type(page.find("textbox", "Date"), "2027-03-14")
    page.click(page.find("button", "Search flights"))
    rows = page.evaluate(
        "[...document.querySelectorAll('tr')].slice(1).map(r => [...r.cells].map(c => c.innerText))"
    )
    direct = [r for r in rows if r[2] == "direct"]
    cheapest = min(direct, key=lambda r: int(r[3].lstrip("$")))[0]
    page.click(page.find("link", f"Select {cheapest}"))
    page.type(page.find("textbox", "First name"), "Alan")
    page.type(page.find("textbox", "Last name"), "Turing")
    page.click(page.find("button", "Confirm booking"))
    print(page.observe().text)
