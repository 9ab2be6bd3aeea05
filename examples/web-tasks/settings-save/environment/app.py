"""settings-save: a settings form; the saved settings (and how often they were saved) are the
state."""

from webapp import App, Redirect, Request, esc, page

THEMES = ["Light", "Dark", "System"]
app = App("Settings", initial={"theme": "Light", "notifications": True, "saves": 0})


@app.get("/settings")
def settings(request: Request) -> str:
    state = app.load()
    options = "".join(
        f"<option{' selected' if t == state['theme'] else ''}>{esc(t)}</option>" for t in THEMES
    )
    checked = " checked" if state["notifications"] else ""
    saved = "<p role='status'>Settings saved.</p>" if request.query.get("saved") else ""
    return page(
        "Settings",
        f"<h1>Settings</h1>{saved}<form method='post' action='/settings'>"
        f"<label>Theme <select name='theme'>{options}</select></label>"
        f"<label><input type='checkbox' name='notifications'{checked}> Email notifications"
        "</label><button type='submit'>Save settings</button></form>",
    )


@app.post("/settings")
def save(request: Request) -> Redirect:
    state = app.load()
    if request.form.get("theme") in THEMES:
        state["theme"] = request.form["theme"]
    state["notifications"] = "notifications" in request.form
    state["saves"] += 1
    app.save(state)
    return Redirect("/settings?saved=1")


@app.get("/")
def home(request: Request) -> Redirect:
    return Redirect("/settings")


if __name__ == "__main__":
    app.run()
