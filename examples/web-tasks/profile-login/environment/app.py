"""profile-login: a sign-in form, a session, and a profile only its user may change; the users'
profiles (and the failed sign-ins) are the state."""

from webapp import App, Redirect, Request, esc, page

app = App(
    "Accounts",
    initial={
        "users": {
            "grace": {"password": "hopper1906", "display_name": "Grace H."},
            "alan": {"password": "enigma1912", "display_name": "Alan T."},
        },
        "failed_sign_ins": 0,
    },
)


@app.get("/")
def home(request: Request) -> str | Redirect:
    if request.session.get("user"):
        return Redirect("/profile")
    error = "<p role='alert'>Wrong user name or password.</p>" if request.query.get("e") else ""
    return page(
        "Sign in",
        f"<h1>Sign in</h1>{error}<form method='post' action='/login'>"
        "<label>User name <input name='user'></label>"
        "<label>Password <input type='password' name='password'></label>"
        "<button type='submit'>Sign in</button></form>",
    )


@app.post("/login")
def login(request: Request) -> Redirect:
    state = app.load()
    user = state["users"].get(request.form.get("user", "").strip())
    if user is None or user["password"] != request.form.get("password"):
        state["failed_sign_ins"] += 1
        app.save(state)
        return Redirect("/?e=1")
    request.session["user"] = request.form["user"].strip()
    return Redirect("/profile")


@app.get("/profile")
def profile(request: Request) -> str | Redirect:
    name = request.session.get("user")
    if not name:
        return Redirect("/")
    user = app.load()["users"][name]
    saved = "<p role='status'>Profile saved.</p>" if request.query.get("saved") else ""
    return page(
        "Profile",
        f"<h1>Profile of {esc(name)}</h1>{saved}<form method='post' action='/profile'>"
        f"<label>Display name <input name='display_name' value='{esc(user['display_name'])}'>"
        "</label><button type='submit'>Save profile</button></form>"
        "<form method='post' action='/logout'><button type='submit'>Sign out</button></form>",
    )


@app.post("/profile")
def save(request: Request) -> Redirect:
    name = request.session.get("user")
    if not name:
        return Redirect("/")
    state = app.load()
    state["users"][name]["display_name"] = request.form.get("display_name", "").strip()
    app.save(state)
    return Redirect("/profile?saved=1")


@app.post("/logout")
def logout(request: Request) -> Redirect:
    request.session.clear()
    return Redirect("/")


if __name__ == "__main__":
    app.run()
