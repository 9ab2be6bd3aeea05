CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     amount_cents INTEGER NOT NULL);
INSERT INTO customers VALUES (1, 'ada'), (2, 'grace'), (3, 'linus'), (4, 'barbara');
INSERT INTO orders (customer_id, amount_cents) VALUES
  (1, 1250), (1, 830), (2, 99900), (3, 15), (3, 2000), (3, 310), (2, 4100);
