"""Wire-level plumbing shared by the workers and the control plane: standard library only.

- ``tlsstream``: a blocking TLS connection through memory BIOs, in large socket I/O (the upload
  proxy's relay, the upload server's TLS front, the cloner's sender);
- ``http1``: HTTP/1.1 heads, body framing and a zero-copy body relay on blocking sockets (the
  upload proxy and the import proxy relay);
- ``connlimit``: slots per client address and total deadlines for every server anything in the
  cluster can reach (the upload proxy, the upload server, a worker's metrics page).

It sits on the bottom floor beside ``cdi.api`` and imports nothing of this project, so a worker
can use it without reaching into the control plane (the ``layers`` contract in pyproject.toml).
"""
