"""newsletter-signup: one form; the subscribers are the state."""

from webapp import App, Redirect, Request, esc, page

app = App("Newsletter", initial={"subscribers": []})


@app.get("/")
def home(request: Request) -> str:
    count = len(app.load()["subscribers"])
    return page(
        "Newsletter",
        "<h1>The Weekly Byte</h1><p>Get one short email a week.</p>"
        "<form method='post' action='/subscribe'>"
        "<label>Email address <input type='email' name='email' required></label>"
        "<button type='submit'>Subscribe</button></form>"
        f"<p>{esc(count)} readers so far.</p>",
    )


@app.post("/subscribe")
def subscribe(request: Request) -> str | Redirect:
    email = request.form.get("email", "").strip()
    if "@" not in email:
        return page("Newsletter", "<h1>That is not an email address</h1><a href='/'>Back</a>")
    state = app.load()
    if email not in state["subscribers"]:
        state["subscribers"].append(email)
        app.save(state)
    return Redirect("/thanks")


@app.get("/thanks")
def thanks(request: Request) -> str:
    return page("Subscribed", "<h1>You are subscribed</h1><a href='/'>Home</a>")


if __name__ == "__main__":
    app.run()
