"""shop-order: a catalogue, product pages, a cart in the session and a checkout; the placed
orders are the state."""

from webapp import App, Redirect, Request, esc, page

PRODUCTS = {
    "red-mug": ("Red Mug", 9),
    "blue-mug": ("Blue Mug", 9),
    "blue-plate": ("Blue Plate", 14),
    "teapot": ("Teapot", 32),
}
app = App("Shop", initial={"orders": []})


def _cart(request: Request) -> dict[str, int]:
    return request.session.setdefault("cart", {})


@app.get("/")
def catalogue(request: Request) -> str:
    items = "".join(
        f"<li><a href='/product?id={pid}'>{esc(name)}</a> ${price}</li>"
        for pid, (name, price) in PRODUCTS.items()
    )
    n = sum(_cart(request).values())
    return page("Shop", f"<h1>Pottery Shop</h1><ul>{items}</ul><a href='/cart'>Cart ({n})</a>")


@app.get("/product")
def product(request: Request) -> str:
    pid = request.query.get("id", "")
    if pid not in PRODUCTS:
        return page("Shop", "<h1>No such product</h1><a href='/'>Shop</a>")
    name, price = PRODUCTS[pid]
    return page(
        name,
        f"<h1>{esc(name)}</h1><p>${price}</p><form method='post' action='/cart/add'>"
        f"<input type='hidden' name='id' value='{pid}'>"
        "<label>Quantity <input type='number' name='quantity' value='1' min='1'></label>"
        "<button type='submit'>Add to cart</button></form><a href='/'>Back to the shop</a>",
    )


@app.post("/cart/add")
def add(request: Request) -> Redirect:
    pid = request.form.get("id", "")
    try:
        quantity = int(request.form.get("quantity", "1"))
    except ValueError:
        quantity = 0
    if pid in PRODUCTS and quantity > 0:
        cart = _cart(request)
        cart[pid] = cart.get(pid, 0) + quantity
    return Redirect("/cart")


@app.get("/cart")
def cart(request: Request) -> str:
    lines = "".join(
        f"<tr><td>{esc(PRODUCTS[p][0])}</td><td>{q}</td></tr>" for p, q in _cart(request).items()
    )
    return page(
        "Cart",
        f"<h1>Your cart</h1><table><tr><th>Item</th><th>Quantity</th></tr>{lines}</table>"
        "<form method='post' action='/cart/empty'><button type='submit'>Empty cart</button>"
        "</form><a href='/checkout'>Checkout</a> <a href='/'>Continue shopping</a>",
    )


@app.post("/cart/empty")
def empty(request: Request) -> Redirect:
    _cart(request).clear()
    return Redirect("/cart")


@app.get("/checkout")
def checkout(request: Request) -> str:
    return page(
        "Checkout",
        "<h1>Checkout</h1><form method='post' action='/order'>"
        "<label>Full name <input name='name'></label>"
        "<label>Street address <input name='address'></label>"
        "<button type='submit'>Place order</button></form>",
    )


@app.post("/order")
def order(request: Request) -> str:
    items = dict(_cart(request))
    if not items:
        return page("Checkout", "<h1>Your cart is empty</h1><a href='/'>Shop</a>")
    state = app.load()
    state["orders"].append(
        {
            "items": items,
            "name": request.form.get("name", "").strip(),
            "address": request.form.get("address", "").strip(),
        }
    )
    app.save(state)
    _cart(request).clear()
    return page("Order placed", f"<h1>Order {len(state['orders'])} placed</h1>")


if __name__ == "__main__":
    app.run()
