"""The bus: how every InfraRSI process talks to NATS JetStream.

- ``client``: connecting, the streams, publishing, durable pull consumers (``Bus``).
- ``reader``: the one in-order reader of a stream (``read_stream``): replay, catch-up, ``events``.
- ``subjects``: every name on the bus and who may publish or read it (``ROUTES``).
- ``credentials``: one nkey per principal and the server's authorization block built from them.
- ``embedded``: the local nats-server with JetStream that the no-infrastructure default starts.
"""
