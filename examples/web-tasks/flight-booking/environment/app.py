"""flight-booking: a search form, a table of results, a passenger form and a confirmation; the
bookings are the state. The cheapest flight of the day has a stop, so the cheapest direct one
must be read from the table."""

from webapp import App, Redirect, Request, esc, page

CITIES = ["Berlin", "Lisbon", "Madrid", "Oslo", "Rome"]
# (id, from, to, date, departure, stops, price)
FLIGHTS = [
    ("OF101", "Lisbon", "Oslo", "2027-03-14", "07:10", 1, 129),
    ("OF102", "Lisbon", "Oslo", "2027-03-14", "09:45", 0, 214),
    ("OF103", "Lisbon", "Oslo", "2027-03-14", "13:20", 0, 187),
    ("OF104", "Lisbon", "Oslo", "2027-03-14", "18:05", 2, 99),
    ("OF105", "Lisbon", "Oslo", "2027-03-14", "21:30", 0, 242),
    ("OF201", "Lisbon", "Oslo", "2027-03-15", "13:20", 0, 150),
    ("OF301", "Oslo", "Lisbon", "2027-03-14", "10:00", 0, 120),
    ("OF401", "Lisbon", "Rome", "2027-03-14", "08:00", 0, 90),
]
app = App("Travel", initial={"bookings": []})


def _select(name: str, label: str, chosen: str) -> str:
    options = "".join(
        f"<option{' selected' if c == chosen else ''}>{esc(c)}</option>" for c in CITIES
    )
    return f"<label>{label} <select name='{name}'>{options}</select></label>"


@app.get("/")
def search(request: Request) -> str:
    return page(
        "Flights",
        "<h1>Find a flight</h1><form method='get' action='/results'>"
        f"{_select('from', 'From', 'Berlin')}{_select('to', 'To', 'Madrid')}"
        "<label>Date <input name='date' placeholder='YYYY-MM-DD'></label>"
        "<button type='submit'>Search flights</button></form>",
    )


@app.get("/results")
def results(request: Request) -> str:
    q = request.query
    found = [
        f
        for f in FLIGHTS
        if (f[1], f[2], f[3]) == (q.get("from"), q.get("to"), q.get("date", "").strip())
    ]
    rows = "".join(
        f"<tr><td>{fid}</td><td>{dep}</td><td>{'direct' if stops == 0 else f'{stops} stop(s)'}"
        f"</td><td>${price}</td><td><a href='/book?flight={fid}'>Select {fid}</a></td></tr>"
        for fid, _, _, _, dep, stops, price in found
    )
    body = (
        f"<table><tr><th>Flight</th><th>Departs</th><th>Stops</th><th>Price</th><th></th></tr>"
        f"{rows}</table>"
        if found
        else "<p>No flights found.</p>"
    )
    return page("Results", f"<h1>Flights</h1>{body}<a href='/'>New search</a>")


@app.get("/book")
def book(request: Request) -> str:
    fid = request.query.get("flight", "")
    if fid not in {f[0] for f in FLIGHTS}:
        return page("Book", "<h1>No such flight</h1><a href='/'>New search</a>")
    return page(
        "Passenger",
        f"<h1>Book flight {esc(fid)}</h1><form method='post' action='/confirm'>"
        f"<input type='hidden' name='flight' value='{esc(fid)}'>"
        "<label>First name <input name='first'></label>"
        "<label>Last name <input name='last'></label>"
        "<button type='submit'>Confirm booking</button></form>",
    )


@app.post("/confirm")
def confirm(request: Request) -> str | Redirect:
    fid = request.form.get("flight", "")
    if fid not in {f[0] for f in FLIGHTS}:
        return Redirect("/")
    state = app.load()
    passenger = f"{request.form.get('first', '').strip()} {request.form.get('last', '').strip()}"
    state["bookings"].append({"flight": fid, "passenger": passenger.strip()})
    app.save(state)
    return page("Booked", f"<h1>Booked: {esc(fid)} for {esc(passenger)}</h1>")


if __name__ == "__main__":
    app.run()
