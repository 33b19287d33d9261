"""``infrarsi dashboard``: a read-only web page over the analyst database, updated live from the bus.

One module per job: ``views`` (what each view shows: SQL over the analyst DuckDB into plain JSON-able values;
no I/O beyond the connection it is handed), ``feed`` (keeps a private analyst DB current with
``eventlog.catch_up``, rung by a core subscription to the lifecycle subjects, and tells the pages when it moved),
``access`` (who may read: loopback by default, a bearer token from ``<data-dir>/creds/`` and TLS beyond it),
``app`` (the Starlette application: the page, its JSON API, its server-sent events and the vendored plotly.js)
and ``static/`` (the page's HTML, script and style).

It must not publish to, or ack on, the bus, and never opens another process's DuckDB file for writing.
"""
